package capacity

import (
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"
)

// simClient is one client process of the simulation.
type simClient struct {
	c      *Client
	r      *Resource
	wants  func(epoch int) float64
	dead   bool
	demand float64
}

// TestSimulation runs 50 clients against one server on virtual time for
// five minutes: steady clients, ramps, on/off clients, a hog that comes
// and goes, a client that dies, and a server restart. Demands change
// every 30 s. It checks, at every 100 ms sample, that the leases held add
// up to no more than the capacity; per refresh interval, that the traffic
// of clients upholding their leases stays within 101% of capacity; and
// per demand epoch, that the grants converge within two refresh intervals
// to at least 95% utilisation and to exactly the weighted max-min fair
// allocation.
func TestSimulation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			capacity = 1000.0
			refresh  = 5 * time.Second
			lease    = 20 * time.Second
			epochLen = 30 * time.Second
			sample   = 100 * time.Millisecond
			run      = 300 * time.Second
			deathAt  = 95 * time.Second
			downAt   = 185 * time.Second
			upAt     = 188 * time.Second
		)
		cfg := Config{Resources: []Template{{ID: "*", Capacity: capacity, LeaseLength: lease, RefreshInterval: refresh}}}
		newServer := func() *Server {
			s, err := NewServer(cfg, withSeed(11))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		net := new(memNetwork)
		net.SetLatency(50 * time.Millisecond) // each way
		server := newServer()
		net.Attach("s1", server)

		var clients []*simClient
		add := func(wants func(int) float64) {
			i := len(clients)
			c, err := NewClient(net, []string{"s1", "s2"}, WithClientID(fmt.Sprintf("c%02d", i)))
			if err != nil {
				t.Fatal(err)
			}
			r := openResource(t, c, "db", wants(0))
			clients = append(clients, &simClient{c: c, r: r, wants: wants})
		}
		for range 30 { // steady
			add(func(int) float64 { return 15 })
		}
		for k := range 10 { // ramps up, then down
			add(func(e int) float64 { return float64(k%3+1) * 5 * float64(min(e, 10-e)+1) })
		}
		for k := range 8 { // on/off
			add(func(e int) float64 {
				if (e+k)%2 == 0 {
					return 30
				}
				return 0
			})
		}
		add(func(e int) float64 { // the hog, present in epochs 2-3 and 7-8
			if e == 2 || e == 3 || e == 7 || e == 8 {
				return 2000
			}
			return 0
		})
		add(func(int) float64 { return 20 }) // dies at deathAt
		dying := clients[len(clients)-1]
		defer func() {
			for _, sc := range clients {
				sc.c.Close() // the dead one's release fails: it is cut off
			}
		}()

		var (
			maxHeld, maxTrafficPct   float64
			trafficWindow            float64
			utilSum                  float64
			utilN                    int
			epochStart               time.Duration
			convergedAt              = map[int]time.Duration{}
			lastBelow                time.Duration
			worstConvergence         time.Duration
			fairChecks, fairMismatch int
		)
		var ds []Demand
		minSkipped := math.Inf(1)
		skipEpoch := func(e int) bool { return e == 0 || e == 3 || e == 6 } // learning, death, restart
		start := time.Now()
		for now := time.Duration(0); now < run; now += sample {
			if now%epochLen == 0 {
				e := int(now / epochLen)
				if e > 0 && !skipEpoch(e-1) {
					// End of the previous epoch: check convergence and
					// exact fair shares.
					conv := lastBelow + sample - epochStart
					convergedAt[e-1] = conv
					worstConvergence = max(worstConvergence, conv)
					var ds []Demand
					var live []*simClient
					for _, sc := range clients {
						if !sc.dead {
							ds = append(ds, Demand{Wants: sc.demand})
							live = append(live, sc)
						}
					}
					want := Allocate(FairShare, capacity, ds)
					for i, sc := range live {
						fairChecks++
						if l, _ := sc.r.Lease(); l.Capacity != want[i] {
							fairMismatch++
							t.Errorf("epoch %d: %s holds %v, fair share %v", e-1, sc.c.ID(), l.Capacity, want[i])
						}
					}
				}
				epochStart, lastBelow = now, now-sample
				for _, sc := range clients {
					if !sc.dead {
						sc.demand = sc.wants(e)
						if err := sc.r.SetWants(sc.demand); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			switch now {
			case deathAt:
				dying.dead, dying.demand = true, 0
				net.Cut(dying.c.ID(), true)
			case downAt:
				net.SetDown("s1", true)
			case upAt:
				server = newServer() // all state lost; it learns
				net.Attach("s1", server)
				net.SetDown("s1", false)
			}
			time.Sleep(sample)
			if got := time.Since(start); got != now+sample {
				t.Fatalf("virtual time %v, want %v", got, now+sample)
			}
			// Sample.
			var held, traffic, wants float64
			nowT := time.Now()
			ds := ds[:0]
			for _, sc := range clients {
				if l, ok := sc.r.Lease(); ok && nowT.Before(l.Expiry) {
					held += l.Capacity
				}
				if !sc.dead {
					traffic += min(sc.demand, sc.r.Capacity())
					wants += sc.demand
				}
				ds = append(ds, Demand{Wants: sc.demand})
			}
			// Distance from the fair allocation of the current demands.
			fair := Allocate(FairShare, capacity, ds)
			var off float64
			for i, sc := range clients {
				var c float64
				if l, ok := sc.r.Lease(); ok {
					c = l.Capacity
				}
				off = max(off, math.Abs(c-fair[i]))
			}
			if held > capacity {
				t.Fatalf("t=%v: leases held %v > capacity %v", now+sample, held, capacity)
			}
			for _, rs := range server.Status().Resources {
				if rs.Held > capacity {
					t.Fatalf("t=%v: server counts %v held > capacity", now+sample, rs.Held)
				}
			}
			maxHeld = max(maxHeld, held)
			trafficWindow += traffic * sample.Seconds()
			if (now+sample)%refresh == 0 {
				pct := 100 * trafficWindow / (capacity * refresh.Seconds())
				maxTrafficPct = max(maxTrafficPct, pct)
				if pct > 101 {
					t.Errorf("t=%v: traffic %.2f%% of capacity in the last refresh interval", now+sample, pct)
				}
				trafficWindow = 0
			}
			target := min(capacity, wants)
			if e := int(now / epochLen); e > 0 && skipEpoch(e) && now-epochStart >= 2*refresh && target > 0 {
				minSkipped = min(minSkipped, held/target)
			}
			if e := int(now / epochLen); !skipEpoch(e) {
				// Converged: 95% utilisation, and every lease within 1%
				// of capacity of its fair share.
				if held < 0.95*target || off > capacity/100 {
					lastBelow = now
				}
				if now-epochStart >= 2*refresh && target > 0 {
					utilSum += held / target
					utilN++
					if held < 0.95*target {
						t.Errorf("t=%v: utilisation %.1f%% of min(capacity, wants) = %v, %v after a change", now+sample, 100*held/target, target, now-epochStart)
					}
				}
			}
		}
		for e, conv := range convergedAt {
			if conv > 2*refresh {
				t.Errorf("epoch %d converged after %v, more than two refresh intervals", e, conv)
			}
		}
		t.Logf("clients %d, capacity %v, refresh %v, lease %v, latency 50ms each way, %v of virtual time", len(clients), capacity, refresh, lease, run)
		t.Logf("max leases held %.3f (%.2f%% of capacity)", maxHeld, 100*maxHeld/capacity)
		t.Logf("max traffic per refresh interval %.2f%% of capacity", maxTrafficPct)
		t.Logf("mean utilisation once converged %.2f%% of min(capacity, wants) over %d samples", 100*utilSum/math.Max(float64(utilN), 1), utilN)
		t.Logf("convergence after a demand change: worst %v; per epoch %v", worstConvergence, convergedAt)
		t.Logf("lowest utilisation in the epochs of the death and the restart, two refresh intervals in (not asserted): %.1f%%", 100*minSkipped)
		t.Logf("fair share checks %d, mismatches %d", fairChecks, fairMismatch)
	})
}
