package gossip

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/testproc"
)

// fullHolds checks, under the entry's lock, that a node whose entry for
// key says its share is spent (now < full) would deny one unit by the
// locked computation too: what full promises must still be true, whatever
// reports, debits and member changes came since it was published.
func fullHolds(t *testing.T, l *Limiter, key string, now int64) {
	t.Helper()
	e := l.table.load(key)
	if e == nil || now >= e.full.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r := now / l.node.interval
	e.begin(r)
	c := l.bucket
	tat := e.tat()
	sh := l.shares(e, l.node.members.Load(), r)
	if q := l.quota(sh, key, r, c.Tokens(now, tat)+e.spent); q > e.spent {
		t.Fatalf("at %d, full until %d, but the quota is %d with %d spent: one unit fits", now, e.full.Load(), q, e.spent)
	}
}

// TestCapRetryAfterExact runs random traffic on three spend-capped nodes,
// with their reports delivered between requests, and checks two things on
// node 0. The lock-free denials are right: while an entry says the share
// is spent, the locked computation agrees. And a denial's RetryAfter is
// exact when only time passes: the same request is denied one nanosecond
// before it and admitted at it (when that is within the round).
func TestCapRetryAfterExact(t *testing.T) {
	for seed := range uint64(4) {
		c := newCluster(t, 3, throttle.PerSecond(40), 12, time.Second, true, seed+1)
		rng := rand.New(rand.NewPCG(seed, 7))
		l := c.lims[0]
		exact, fast := 0, 0
		for range 4000 {
			for _, o := range c.lims[1:] {
				if rng.IntN(3) == 0 {
					if _, err := o.Allow(ctx, "k", 1); err != nil {
						t.Fatal(err)
					}
				}
			}
			now := c.clk.Now().UnixNano()
			fullHolds(t, l, "k", now)
			if e := l.table.load("k"); e != nil && now < e.full.Load() {
				fast++
			}
			n := 1
			if rng.IntN(4) == 0 {
				n = 2 + rng.IntN(3)
			}
			d, err := l.Allow(ctx, "k", n)
			if err != nil {
				t.Fatal(err)
			}
			end := (now/l.node.interval + 1) * l.node.interval
			if !d.Allowed && now+int64(d.RetryAfter) < end {
				c.clk.Advance(d.RetryAfter - 1)
				if d2, _ := l.Allow(ctx, "k", n); d2.Allowed {
					t.Fatalf("seed %d: %d units denied at %d with RetryAfter %v, admitted 1 ns earlier", seed, n, now, d.RetryAfter)
				}
				c.clk.Advance(1)
				if d3, _ := l.Allow(ctx, "k", n); !d3.Allowed {
					t.Fatalf("seed %d: %d units denied at %d with RetryAfter %v, denied again then: %+v", seed, n, now, d.RetryAfter, d3)
				}
				exact++
			}
			c.runTo(c.clk.Now().Add(time.Duration(rng.IntN(40)) * time.Millisecond))
		}
		t.Logf("seed %d: %d exact, %d fast", seed, exact, fast)
		if exact < 100 || fast < 50 {
			t.Fatalf("seed %d: %d RetryAfters checked, %d lock-free denials: the trace misses its point", seed, exact, fast)
		}
	}
}

// TestCapFullClearedByMembers: a node that spent its share publishes that
// fact for lock-free denials; when a peer leaves, its share grows, and the
// next request must be decided afresh and admitted.
func TestCapFullClearedByMembers(t *testing.T) {
	c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 9, time.Second, true, 1)
	c.settle()
	l := c.lims[0]
	for i := range 4 {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 3) { // a third of the 9 tokens
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if e := l.table.load("k"); c.clk.Now().UnixNano() >= e.full.Load() {
		t.Fatal("a node whose share is spent publishes nothing")
	}
	c.nodes[0].Leave("n2")
	if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
		t.Fatalf("after a peer left, with half the tokens to itself, the node denied: %+v", d)
	}
}

// TestCapFullClearedByReports: a node whose share is spent publishes that
// fact for lock-free denials; when its peers' reports then show they no
// longer ask for anything, its share grows to all the tokens left, and
// the next request must be decided afresh and admitted.
func TestCapFullClearedByReports(t *testing.T) {
	c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 9, time.Second, true, 1)
	c.settle()
	l := c.lims[0]
	r := c.clk.Now().UnixNano() / int64(time.Second)
	born := c.clk.Now().UnixNano() - 1
	report := func(peer string, round int64, demand uint64) {
		m := &message{header: header{typ: msgReport, sender: peer, table: "api", incarnation: 7, round: uint64(round)},
			reports: []reportEntry{{key: "k", born: born, demand: demand}}}
		l.applyReport(m, born-1, l.node.tick.Load())
	}
	// The peers asked for 100 units each in the last round, this node for
	// one: its share is a tiny fraction of the 9 tokens, none of them.
	if _, err := l.Allow(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"n1", "n2"} {
		report(p, r-1, 1000)
		report(p, r, 1100)
	}
	c.runTo(c.clk.Now().Add(time.Second))
	if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
		t.Fatalf("with a share of 1/201, the node admitted: %+v", d)
	}
	if e := l.table.load("k"); c.clk.Now().UnixNano() >= e.full.Load() {
		t.Fatal("a node whose share is spent publishes nothing")
	}
	// Now the peers report they asked for nothing more.
	for _, p := range []string{"n1", "n2"} {
		report(p, r+1, 1100)
	}
	if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
		t.Fatalf("with every token to itself, the node denied: %+v", d)
	}
}

// TestCapClockStepsBack: a clock stepped back by an hour does not keep
// the node denying on what it published before the step; the decision is
// made afresh, and its RetryAfter is exact.
func TestCapClockStepsBack(t *testing.T) {
	c := newCluster(t, 3, throttle.PerSecond(40), 12, time.Second, true, 1)
	c.settle()
	l := c.lims[0]
	for {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
	}
	if e := l.table.load("k"); c.clk.Now().UnixNano() >= e.full.Load() {
		t.Fatal("a node whose share is spent publishes nothing")
	}
	c.clk.Set(c.clk.Now().Add(-time.Hour))
	d, err := l.Allow(ctx, "k", 1)
	if err != nil || d.Allowed {
		t.Fatalf("an hour before the bucket's last admission: %+v %v", d, err)
	}
	c.clk.Advance(d.RetryAfter - 1)
	if d2, _ := l.Allow(ctx, "k", 1); d2.Allowed {
		t.Fatalf("admitted 1 ns before RetryAfter %v", d.RetryAfter)
	}
	c.clk.Advance(1)
	if d3, _ := l.Allow(ctx, "k", 1); !d3.Allowed {
		t.Fatalf("denied at RetryAfter %v: %+v", d.RetryAfter, d3)
	}
}

// FuzzCapDecisions drives three spend-capped nodes with the operations the
// input spells (requests of 1 to 5 units on node 0, requests on the
// peers, time passing with reports delivered, a peer leaving and coming
// back) and checks that what node 0 publishes for lock-free denials always
// holds, and that every decision is sane: no error, a RetryAfter within
// the round for a denial (or, while the node is gated after its start,
// the time the refill since the start covers it), none for an admission.
func FuzzCapDecisions(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 4, 0, 0, 13, 2, 6, 0, 1, 5, 0})
	f.Add([]byte{3, 7, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 2000 {
			ops = ops[:2000]
		}
		c := newCluster(t, 3, throttle.PerSecond(40), 12, 100*time.Millisecond, true, 1)
		l := c.lims[0]
		left := false
		for _, op := range ops {
			arg := int(op >> 2)
			switch op & 3 {
			case 0, 1:
				n := 1
				if op&3 == 1 {
					n = 1 + arg%5
				}
				now := c.clk.Now().UnixNano()
				fullHolds(t, l, "k", now)
				gated := l.node.gated.Load()
				d, err := l.Allow(ctx, "k", n)
				end := (now/l.node.interval + 1) * l.node.interval
				if gated {
					// The start gate admits what refilled since the start:
					// its RetryAfter is when that covers n, past the round.
					end = math.MaxInt64
				}
				switch {
				case err != nil:
					t.Fatal(err)
				case d.Allowed && d.RetryAfter != 0:
					t.Fatalf("admitted with RetryAfter %v", d.RetryAfter)
				case !d.Allowed && (d.RetryAfter <= 0 || now+int64(d.RetryAfter) > end):
					t.Fatalf("denied at %d with RetryAfter %v, round ends at %d", now, d.RetryAfter, end)
				}
			case 2:
				if _, err := c.lims[1+arg%2].Allow(ctx, "k", 1+arg%3); err != nil {
					t.Fatal(err)
				}
			case 3:
				if arg == 63 {
					if left {
						c.nodes[0].Join("n2")
					} else {
						c.nodes[0].Leave("n2")
					}
					left = !left
					continue
				}
				c.runTo(c.clk.Now().Add(time.Duration(arg) * time.Millisecond))
			}
		}
	})
}

// TestCapConcurrentFlood floods one key of a spend-capped node from four
// goroutines on a frozen clock, with requests of one and two units, so
// that lock-free and locked denials race the admissions. The node's share
// is half the 10 tokens (its one peer has reported nothing): exactly 5
// units must be admitted, and every unit asked for must be counted once,
// as a hit or as unmet demand, up to the round's demand ceiling: a short
// flood is counted exactly, a long one up to the ceiling (plus the units
// admitted after it was reached). Another pass does the same while a goroutine makes the
// peer leave and join again: the share moves, but the bucket's 10 tokens
// bound what is admitted, and every admitted unit is counted.
func TestCapConcurrentFlood(t *testing.T) {
	for _, tc := range []struct {
		churn bool
		each  int // requests per goroutine
	}{{false, 20}, {false, 500}, {true, 500}} {
		c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 10, time.Second, true, 1)
		c.settle()
		l := c.lims[0]
		var admitted, asked atomic.Int64
		stop := func() {}
		if tc.churn {
			stop = testproc.Repeat(1, func() bool {
				c.nodes[0].Leave("n1")
				runtime.Gosched()
				c.nodes[0].Join("n1")
				return true
			})
		}
		var flood sync.WaitGroup
		for g := range 4 {
			n := 1 + g%2
			flood.Go(func() {
				for range tc.each {
					d, err := l.Allow(ctx, "k", n)
					if err != nil {
						t.Error(err)
						return
					}
					asked.Add(int64(n))
					if d.Allowed {
						admitted.Add(int64(n))
					}
				}
			})
		}
		flood.Wait()
		stop()
		e := l.table.load("k")
		demand := e.hits.Load() + e.unmet.Load()
		switch {
		case !tc.churn && admitted.Load() != 5:
			t.Errorf("admitted %d units, want the node's share, 5", admitted.Load())
		case tc.churn && admitted.Load() > 10:
			t.Errorf("with the peer leaving and joining: admitted %d units, more than the bucket's 10", admitted.Load())
		case e.hits.Load() != admitted.Load():
			t.Errorf("counted %d hits; %d admitted", e.hits.Load(), admitted.Load())
		case tc.churn:
			// (While the peer is away the node decides alone, without
			// the cap, and counts no unmet demand.)
		case asked.Load() <= l.demand && demand != asked.Load():
			t.Errorf("counted a demand of %d (%d unmet); %d asked", demand, e.unmet.Load(), asked.Load())
		case asked.Load() > l.demand && (demand < l.demand || demand > l.demand+e.hits.Load()):
			t.Errorf("counted a demand of %d (%d unmet) with %d asked; the ceiling is %d", demand, e.unmet.Load(), asked.Load(), l.demand)
		}
	}
}

// TestDemandCeiling: a round counts a node's demand up to the ceiling, and
// a peer reporting more weighs no more than that. Node 0 spends its half
// of the 10 tokens and is then flooded far past the ceiling; its peer
// reports an even larger demand. Both weigh the ceiling in the next round,
// so node 0 gets half of the 5 tokens left, not nothing.
func TestDemandCeiling(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 10, time.Second, true, 1)
	c.settle()
	l := c.lims[0]
	if want := int64(16 * 10); l.demand != want {
		t.Fatalf("ceiling %d, want %d", l.demand, want)
	}
	admitted := 0
	for range 1000 {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	e := l.table.load("k")
	if admitted != 5 || e.hits.Load()+e.unmet.Load() != l.demand {
		t.Fatalf("admitted %d, counted a demand of %d with 1000 asked; want 5 and the ceiling, %d", admitted, e.hits.Load()+e.unmet.Load(), l.demand)
	}
	r := c.clk.Now().UnixNano() / int64(time.Second)
	born := c.clk.Now().UnixNano() - 1
	for i, demand := range []uint64{0, 1 << 40} {
		m := &message{header: header{typ: msgReport, sender: "n1", table: "api", incarnation: 7, round: uint64(r - 1 + int64(i))},
			reports: []reportEntry{{key: "k", born: born, demand: demand}}}
		l.applyReport(m, born-1, l.node.tick.Load())
	}
	c.runTo(c.clk.Now().Add(time.Second))
	admitted = 0
	for range 10 {
		if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
			admitted++
		}
	}
	if admitted < 2 || admitted > 3 {
		t.Fatalf("admitted %d of the 5 tokens left, want half of them", admitted)
	}
}
