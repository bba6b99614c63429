package capacity

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestShareMatchesAllocate: the shares the server hands out without
// dividing (Static, None, and demands that fit) are Allocate's, for
// random demands, weights, priorities and capacities, after every change.
func TestShareMatchesAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, alg := range []Algorithm{FairShare, ProportionalShare, Static, None} {
		for _, capacity := range []float64{0, 7, 100, 1e6} {
			s := laterServer(t, Config{Resources: []Template{{ID: "*", Capacity: capacity, Algorithm: alg}}})
			for step := range 1000 {
				rr := ResourceRequest{Resource: "r", Wants: float64(rng.IntN(40)) / 4, Weight: float64(rng.IntN(3)), Priority: int32(rng.IntN(2))}
				if _, err := s.GetCapacity(context.Background(), &Request{Client: fmt.Sprintf("c%d", rng.IntN(12)), Resources: []ResourceRequest{rr}}); err != nil {
					t.Fatal(err)
				}
				r := s.resources["r"]
				ds := make([]Demand, len(r.list))
				for i, h := range r.list {
					ds[i] = Demand{Wants: h.wants, Weight: h.weight, Priority: int(h.prio)}
				}
				want := Allocate(alg, capacity, ds)
				for i, h := range r.list {
					if got := r.share(h); got != want[i] {
						t.Fatalf("%v, capacity %v, step %d: %s's share %v, Allocate %v", alg, capacity, step, h.client, got, want[i])
					}
				}
			}
		}
	}
}

// TestConcurrentResources: requests on several resources at once (refreshes
// under the resources' own locks, new clients, requests on two resources,
// releases, configuration changes, Status and Clients) never make a
// resource's leases add up to more than its capacity. Run with -race.
func TestConcurrentResources(t *testing.T) {
	cfg := func(c float64) Config {
		return Config{Resources: []Template{{ID: "*", Capacity: c, LeaseLength: time.Minute, RefreshInterval: time.Second}}}
	}
	s := laterServer(t, cfg(100))
	ids := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				client := fmt.Sprintf("c%d", rng.IntN(20))
				rrs := []ResourceRequest{{Resource: ids[rng.IntN(len(ids))], Wants: float64(rng.IntN(60))}}
				if i%5 == 0 {
					if o := ids[rng.IntN(len(ids))]; o != rrs[0].Resource {
						rrs = append(rrs, ResourceRequest{Resource: o, Wants: float64(rng.IntN(60))})
					}
				}
				var err error
				switch {
				case i%17 == 0:
					_, err = s.Release(context.Background(), &ReleaseRequest{Client: client, Resources: []string{rrs[0].Resource}})
				default:
					_, err = s.GetCapacity(context.Background(), &Request{Client: client, Resources: rrs})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 3 {
			case 0:
				if err := s.SetConfig(cfg(float64(80 + 20*(i%2)))); err != nil {
					t.Error(err)
				}
			case 1:
				for _, r := range s.Status().Resources {
					if r.Held > 100 {
						t.Errorf("%s: %v held of at most 100", r.ID, r.Held)
					}
				}
			default:
				s.Clients(ids[i%len(ids)], 5)
			}
		}
	})
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	for _, r := range s.Status().Resources {
		if r.Held > 100 {
			t.Errorf("%s: %v held of at most 100", r.ID, r.Held)
		}
	}
	// The lease counts, kept by requests on different resources at
	// once, match the holders.
	total, per := 0, map[string]int{}
	for _, r := range s.resources {
		total += len(r.list)
		for _, h := range r.list {
			per[h.client]++
		}
	}
	if s.leases.total != total || !maps.Equal(s.leases.perClient, per) {
		t.Errorf("lease counts %d %v, holders %d %v", s.leases.total, s.leases.perClient, total, per)
	}
}

// TestRefreshBesideBusyResource: while one resource is locked (as during a
// long division, or while Status reads it), a refresh on another resource
// and Status's reading of the others go on.
func TestRefreshBesideBusyResource(t *testing.T) {
	s := laterServer(t, Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: time.Minute, RefreshInterval: time.Second}}})
	for _, id := range []string{"big", "small"} {
		for range 2 { // the second is a refresh: the sweep is done
			if _, err := s.GetCapacity(context.Background(), &Request{Client: "c", Resources: []ResourceRequest{{Resource: id, Wants: 1}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	big := s.resources["big"]
	big.mu.Lock()
	status := make(chan Status)
	go func() { status <- s.Status() }() // waits for big
	done := make(chan error)
	go func() {
		_, err := s.GetCapacity(context.Background(), &Request{Client: "c", Resources: []ResourceRequest{{Resource: "small", Wants: 2}}})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a refresh on another resource waited for the busy one")
	}
	big.mu.Unlock()
	if st := <-status; len(st.Resources) != 2 {
		t.Fatalf("status: %+v", st)
	}
}
