package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

// gaugeServer serves gauges of capacity 10 (lease 10s, refresh 2s) at s1
// on the network it returns, past learning.
func gaugeServer(t *testing.T) *memNetwork {
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
	s, err := NewServer(cfg, withSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second) // past learning
	n := new(memNetwork)
	n.Attach("s1", s)
	return n
}

// openGauge opens gauge r, wanting 10, on a Pessimistic client id of s1.
func openGauge(t *testing.T, n *memNetwork, id string, opts ...ClientOption) *GaugeResource {
	c := dialClient(t, n, []string{"s1"}, append([]ClientOption{WithClientID(id), WithMode(Pessimistic), WithMinRefreshGap(0)}, opts...)...)
	g, err := c.Gauge("r", 10)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestFaultGaugeUnitsInFlight: A holds 10 units of a gauge of capacity 10
// when B asks for 10; A's lease drops to 5, but the semaphore does not
// take held units back. A reports what it holds, max(lease, units held),
// so the server counts A's 10 until A has released units: sampled every
// 10ms while B takes every unit its lease allows, the units held add up
// to at most 10, and B gets its 5 once A is down to its lease.
func TestFaultGaugeUnitsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := gaugeServer(t)
		gauge := func(id string) *GaugeResource { return openGauge(t, n, id) }
		a := gauge("a")
		time.Sleep(time.Second)
		var releases []func()
		for range 10 {
			d, release, err := a.TryHold(t.Context(), "", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("a's unit %d of its lease of 10: %+v, %v", len(releases)+1, d, err)
			}
			releases = append(releases, release)
		}
		b := gauge("b")
		worst := 0
		sample := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
				for {
					if d, release, _ := b.TryHold(t.Context(), "", 1); !d.Allowed {
						break
					} else {
						releases = append(releases, release) // b keeps them
					}
				}
				if sum := a.InFlight() + b.InFlight(); sum > worst {
					worst = sum
					if sum > 10 {
						t.Errorf("t=%v: units held %d (a %d, b %d) > 10", time.Now(), sum, a.InFlight(), b.InFlight())
					}
				}
			}
		}
		sample(40 * time.Second) // several of a's old leases expire
		for _, release := range releases[:5] {
			release() // a is down to its share
		}
		sample(10 * time.Second)
		if got := b.InFlight(); got != 5 {
			t.Errorf("b holds %d units once a released 5, want 5", got)
		}
		t.Logf("worst units held %d of 10", worst)
	})
}

// TestFaultGaugeTreeRandom: four gauge clients of two leaves under a
// root of 20 take every unit their leases allow, release some at random
// and change their wants, on virtual time, for 40 seeds of 2 minutes:
// sampled every 10ms, the units they hold add up to at most 20.
func TestFaultGaugeTreeRandom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { gaugeTreeRun(t, seed) })
		})
	}
}

func gaugeTreeRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 20, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
	net := new(memNetwork)
	newTree(t, net, cfg, []treeNode{{"root", ""}, {"leaf1", "root"}, {"leaf2", "root"}})
	time.Sleep(10 * time.Second) // all learn
	type gauge struct {
		g        *GaugeResource
		releases []func()
	}
	var gs []*gauge
	for i, leaf := range []string{"leaf1", "leaf1", "leaf2", "leaf2"} {
		c := dialClient(t, net, []string{leaf}, WithClientID(fmt.Sprint("g", i)), WithMode(Pessimistic), WithMinRefreshGap(0))
		g, err := c.Gauge("r", float64(1+rng.IntN(20)))
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, &gauge{g: g})
	}
	worst := 0
	for now := time.Duration(0); now < 2*time.Minute; now += 10 * time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		x := gs[rng.IntN(len(gs))]
		switch rng.IntN(100) {
		case 0: // give back some units
			n := rng.IntN(len(x.releases) + 1)
			for _, release := range x.releases[:n] {
				release()
			}
			x.releases = x.releases[n:]
		case 1:
			_ = x.g.SetWants(float64(rng.IntN(21)))
		}
		sum := 0
		for _, y := range gs {
			for { // take every unit the lease allows
				d, release, _ := y.g.TryHold(t.Context(), "", 1)
				if !d.Allowed {
					break
				}
				y.releases = append(y.releases, release)
			}
			sum += y.g.InFlight()
		}
		if sum > worst {
			worst = sum
			if sum > 20 {
				for _, y := range gs {
					l, ok := y.g.Lease()
					t.Logf("%s: in flight %d, capacity %v, lease %+v %v, wants %v", y.g.c.ID(), y.g.InFlight(), y.g.Capacity(), l, ok, y.g.Wants())
				}
				t.Fatalf("t=%v: units held add up to %d > 20", now, sum)
			}
		}
	}
	for _, y := range gs {
		for _, release := range y.releases {
			release()
		}
	}
}

// TestFaultGaugeFailover: a holds 10 units of 10 and then wants only 5;
// the master fails, and the new one learns: a reports its 10 units, which
// the new master must count, although it confirms a lease of 5, so that b
// gets nothing until a has released units.
func TestFaultGaugeFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
		e := &testElection{}
		e.elect("s1")
		n := new(memNetwork)
		var cancels []context.CancelFunc
		for _, addr := range []string{"s1", "s2"} {
			s, err := NewServer(cfg, withSeed(1))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancels = append(cancels, cancel)
			go s.Run(ctx, e, addr)
			n.Attach(addr, s)
		}
		defer func() {
			for _, c := range cancels {
				c()
			}
		}()
		time.Sleep(10 * time.Second)
		gauge := func(id string, wants float64) *GaugeResource {
			c := dialClient(t, n, []string{"s1", "s2"}, WithClientID(id), WithMode(Pessimistic), WithMinRefreshGap(0))
			g, err := c.Gauge("r", wants)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		a := gauge("a", 10)
		time.Sleep(time.Second)
		release, err := a.Hold(t.Context(), "", 10)
		if err != nil {
			t.Fatal(err)
		}
		_ = a.SetWants(5)
		time.Sleep(5 * time.Second)
		n.SetDown("s1", true)
		cancels[0]()
		e.elect("s2")
		b := gauge("b", 10)
		worst := 0
		for range 3000 { // 30s
			time.Sleep(10 * time.Millisecond)
			for {
				d, _, _ := b.TryHold(t.Context(), "", 1)
				if !d.Allowed {
					break
				}
			}
			worst = max(worst, a.InFlight()+b.InFlight())
		}
		if worst > 10 {
			t.Errorf("units held add up to %d of 10 across the failover", worst)
		}
		release() // a is down to its share: b gets the other half
		time.Sleep(10 * time.Second)
		if c := b.Capacity(); c != 5 {
			t.Errorf("b may use %v once a released its units, want 5", c)
		}
	})
}

// TestFaultGaugeCarriedUnitsNotConfirmed: A keeps 5 units of a gauge of
// 10 past its lease's expiry (cut off: they come on top by design) while B
// takes all 10. The server restarts and learns; A reaches it first. A
// must not report its carried units as held, or the learning server
// confirms them as a lease that B's lease already covers: A would then
// release them and take 5 new units under it, 15 in all with B's 10. A is
// cut off past every count of its lease (25s) or only past its lease
// (12s) and then granted 0 by the old server before it restarts: that
// grant must not make the units A kept past its lapsed lease reportable
// again (15 of 10 before).
func TestFaultGaugeCarriedUnitsNotConfirmed(t *testing.T) {
	for _, c := range []struct {
		name    string
		cut     time.Duration
		regrant bool
	}{{"past every count", 25 * time.Second, false}, {"regranted after its lease lapsed", 12 * time.Second, true}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { carriedNotConfirmed(t, c.cut, c.regrant) })
		})
	}
}

func carriedNotConfirmed(t *testing.T, cut time.Duration, regrant bool) {
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: time.Second}}}
	n := new(memNetwork)
	server := func() {
		s, err := NewServer(cfg, withSeed(1))
		if err != nil {
			t.Fatal(err)
		}
		n.Attach("s1", s)
	}
	server()
	time.Sleep(10 * time.Second) // past learning
	take := func(g *GaugeResource) (releases []func()) {
		for {
			d, release, err := g.TryHold(t.Context(), "", 1)
			if err != nil || !d.Allowed {
				return releases
			}
			releases = append(releases, release)
		}
	}
	a := openGauge(t, n, "a", WithRetry(100*time.Millisecond))
	b := openGauge(t, n, "b", WithRetry(100*time.Millisecond))
	time.Sleep(3 * time.Second)
	carried := take(a)
	n.Cut("a", true)
	time.Sleep(cut) // past a's lease; b gets all 10
	held := take(b)
	if regrant {
		n.Cut("a", false)
		time.Sleep(3 * time.Second) // the old server grants a 0: b holds all 10
	}
	n.Cut("a", true)
	n.Cut("b", true)
	server() // restarted with its state lost: it learns
	n.Cut("a", false)
	time.Sleep(5 * time.Second) // still learning; b is cut off
	for _, release := range carried {
		release()
	}
	fresh := take(a)
	if sum := a.InFlight() + b.InFlight(); sum > 10 {
		t.Errorf("units taken under leases: a %d, b %d: %d > 10 (a carried %d past its lease)", len(fresh), len(held), sum, len(carried))
	}
	n.Cut("b", false)
}

// TestFaultGaugeCarriedUnitsReleasedAndRetaken: A keeps 4 units past
// every count of its lease (cut off), which it then leaves out of its
// reports. Back in touch, it releases those 4 and takes 10 fresh units
// under its new lease of 10, between two refreshes. B arrives and A's
// lease drops to 5; A releases one unit and holds 9 fresh ones. A must
// report them all: a report that still leaves 4 of them out as carried
// (the client noticed releases only when it reported) lets the server
// confirm A's lease of 5 and grant B 5: 14 units of 10.
func TestFaultGaugeCarriedUnitsReleasedAndRetaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := gaugeServer(t)
		gauge := func(id string) *GaugeResource { return openGauge(t, n, id, WithRetry(100*time.Millisecond)) }
		take := func(g *GaugeResource, max int) (releases []func()) {
			for len(releases) < max {
				d, release, err := g.TryHold(t.Context(), "", 1)
				if err != nil || !d.Allowed {
					break
				}
				releases = append(releases, release)
			}
			return releases
		}
		a := gauge("a")
		time.Sleep(time.Second)
		carried := take(a, 4)
		n.Cut("a", true)
		time.Sleep(25 * time.Second) // past every count of a's lease
		n.Cut("a", false)
		time.Sleep(3 * time.Second) // a's lease of 10 is back (retries back off to 1.6s)
		if c := a.Capacity(); c != 10 {
			t.Fatalf("a's capacity %v after the cut, want 10", c)
		}
		for _, release := range carried {
			release()
		}
		fresh := take(a, 10)
		if len(fresh) != 10 {
			t.Fatalf("a took %d fresh units under its lease of 10", len(fresh))
		}
		b := gauge("b")
		time.Sleep(5 * time.Second) // a's lease drops to 5
		fresh[0]()
		worst := 0
		var held []func()
		for range 2000 { // 20s
			time.Sleep(10 * time.Millisecond)
			held = append(held, take(b, 10)...)
			worst = max(worst, a.InFlight()+b.InFlight())
		}
		if worst > 10 {
			t.Errorf("units held add up to %d of 10 (a %d, all taken under its leases; b %d)", worst, a.InFlight(), b.InFlight())
		}
		for _, release := range append(held, fresh[1:]...) {
			release()
		}
	})
}

// TestFaultTreeLeafWithoutParentLeaseGrantsZero: a root of 10 (safe
// capacity 5) with two leaves; gauge clients a (leaf l1) and b (leaf l2)
// want 10 each and hold nothing. l1 is cut off from the root, not from a:
// its lease at the root runs out, and the root gives b all 10; then both
// take every unit they may, for 30s. A leaf
// whose parent lease has expired grants 0 until it is renewed: before, l1
// handed a the safe capacity under leases of its own, and a took 5 units
// while b held 10, 15 in all.
func TestFaultTreeLeafWithoutParentLeaseGrantsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second, SafeCapacity: 5}}}
		net := new(memNetwork)
		newTree(t, net, cfg, []treeNode{{"root", ""}, {"l1", "root"}, {"l2", "root"}})
		time.Sleep(10 * time.Second) // all learn
		gauge := func(leaf, id string) *GaugeResource {
			c := dialClient(t, net, []string{leaf}, WithClientID(id), WithMode(Pessimistic), WithMinRefreshGap(0))
			g, err := c.Gauge("r", 10)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		a, b := gauge("l1", "a"), gauge("l2", "b")
		time.Sleep(5 * time.Second)
		if ca, cb := a.Capacity(), b.Capacity(); ca != 5 || cb != 5 {
			t.Fatalf("a may use %v and b %v before the cut, want 5 each", ca, cb)
		}
		net.Cut("l1", true)
		time.Sleep(15 * time.Second) // l1's lease at the root has run out
		var held []func()
		worst := 0
		for range 3000 { // 30s
			time.Sleep(10 * time.Millisecond)
			for _, g := range []*GaugeResource{a, b} {
				for {
					d, release, _ := g.TryHold(t.Context(), "", 1)
					if !d.Allowed {
						break
					}
					held = append(held, release)
				}
			}
			worst = max(worst, a.InFlight()+b.InFlight())
		}
		if worst > 10 || b.InFlight() != 10 {
			t.Errorf("units held add up to %d of 10 at worst (a %d, b %d at the end)", worst, a.InFlight(), b.InFlight())
		}
		if c := a.Capacity(); c != 0 {
			t.Errorf("a may use %v while l1 holds no lease at the root, want 0", c)
		}
		for _, release := range held {
			release()
		}
	})
}

// fastClock is a server clock that runs at rate 1+rho from start on.
type fastClock struct {
	start time.Time
	rho   float64
}

func (c fastClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * (1 + c.rho)))
}

// TestFaultGaugeFastServerClock: the server's clock runs 4 % fast. A
// holds all 10 units of a gauge of capacity 10 when it is cut off just
// after a refresh, and comes back just before its lease ends on its own
// clock, which the server's clock has passed already; B asks every
// 100ms. The server must not hand out again the capacity A still holds
// under its unexpired lease: sampled every 10ms, the units held under
// unexpired leases add up to at most 10.
func TestFaultGaugeFastServerClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 100 * time.Millisecond}}}
		s, err := NewServer(cfg, withSeed(1), WithServerClock(fastClock{time.Now(), 0.04}))
		if err != nil {
			t.Fatal(err)
		}
		n := new(memNetwork)
		n.Attach("s1", s)
		time.Sleep(10 * time.Second) // past learning
		a := openGauge(t, n, "a", WithRetry(10*time.Millisecond))
		time.Sleep(time.Second)
		var carried []func()
		for range 10 {
			if d, release, err := a.TryHold(t.Context(), "", 1); err == nil && d.Allowed {
				carried = append(carried, release)
			}
		}
		b := openGauge(t, n, "b", WithRetry(10*time.Millisecond))
		worst := 0
		sample := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
				for {
					d, release, _ := b.TryHold(t.Context(), "", 1)
					if !d.Allowed {
						break
					}
					_ = release // b keeps its units
				}
				sum := b.InFlight()
				if _, ok := a.Lease(); ok {
					sum += a.InFlight() // units kept past a's lease come on top
				}
				if sum > worst {
					worst = sum
					if sum > 10 {
						t.Errorf("t=%v: units held under leases %d (a %d, b %d) > 10", time.Now(), sum, a.InFlight(), b.InFlight())
					}
				}
			}
		}
		sample(3 * time.Second)
		n.Cut("a", true)
		lease, ok := a.Lease()
		if !ok {
			t.Fatal("a has no lease when cut off")
		}
		// Back 250ms before its lease ends on its own clock, past its
		// end on the server's (about 385ms before).
		sample(time.Until(lease.Expiry) - 250*time.Millisecond)
		n.Cut("a", false)
		sample(15 * time.Second)
		for _, release := range carried {
			release()
		}
		sample(5 * time.Second)
		if got := b.InFlight(); got < 5 {
			t.Errorf("b holds %d units once a released its 10, want at least 5", got)
		}
		t.Logf("worst units held under leases %d of 10", worst)
	})
}
