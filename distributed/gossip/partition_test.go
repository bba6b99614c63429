package gossip

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// partitionRun drives one client at 3x its rate through a random load
// balancer over nodes nodes (rate 50/s, burst 100, 1 s interval), cuts the
// cluster in two halves for cut, heals it, and keeps going until the debt
// can be paid back. It returns what the limiters admitted in total over
// what one bucket admits over the same trace (burst + rate x elapsed).
func partitionRun(t *testing.T, nodes int, cut time.Duration, seed uint64) float64 {
	rate, burst := throttle.PerSecond(50), 100
	c := newCluster(t, nodes, rate, burst, time.Second, false, seed)
	c.net.SetDuplicate(0.02)
	rng := rand.New(rand.NewPCG(seed, 11))
	start := c.clk.Now()
	from, heal := start.Add(5*time.Second), start.Add(5*time.Second+cut)
	end := heal.Add(cut + 20*time.Second)
	gap := time.Second / 150
	admitted, parted := int64(0), false
	for at := start; at.Before(end); at = at.Add(time.Duration(rng.ExpFloat64() * float64(gap))) {
		c.runTo(at)
		switch {
		case !parted && !at.Before(from) && at.Before(heal):
			c.net.Partition(c.addrs[:nodes/2], c.addrs[nodes/2:])
			parted = true
		case parted && !at.Before(heal):
			c.net.Heal()
			parted = false
		}
		d, err := c.lims[rng.IntN(nodes)].Allow(ctx, "client", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	c.runTo(end)
	ideal := int64(burst) + rate.Events(end.Sub(start))
	return float64(admitted) / float64(ideal)
}

// TestPartitionLongRunExact: hits admitted on both sides of a partition,
// however long, are charged everywhere once it heals, so what the
// limiters admit in total comes back to what one bucket admits: the cap
// on reports must not discard a peer's honest hits made while it was
// unheard.
func TestPartitionLongRunExact(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		cut   time.Duration
	}{{2, 10 * time.Second}, {2, 30 * time.Second}, {8, 30 * time.Second}} {
		t.Run(fmt.Sprintf("nodes=%d/cut=%v", tc.nodes, tc.cut), func(t *testing.T) {
			ratio := partitionRun(t, tc.nodes, tc.cut, 1)
			t.Logf("%d nodes, %v partition: admitted %.4f of one bucket", tc.nodes, tc.cut, ratio)
			if ratio > 1.01 {
				t.Errorf("admitted %.4f of one bucket, want <= 1.01", ratio)
			}
		})
	}
}

// TestSlowRateReportsNotCapped: a peer reporting a key of a slow limit (a
// token a minute, less than one a round) is charged for all it admits.
// The cap on its reports refilled by whole tokens per report, so the
// fraction of a token each round brings was lost at every report, and
// with a report every 20 s the cap never refilled: past burst+1 units
// the peer's honest hits were discarded (Stats.Capped) and never charged.
func TestSlowRateReportsNotCapped(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 2, time.Second, false, 1)
	admitted := 0
	for range 30 { // 10 minutes, one ask every 20 s: 3x the rate
		if d, _ := c.lims[0].Allow(ctx, "slow", 1); d.Allowed {
			admitted++
		}
		c.runTo(c.clk.Now().Add(20 * time.Second))
	}
	st := c.nodes[1].Stats()
	t.Logf("node 0 admitted %d; node 1 charged %d and capped %d", admitted, st.HitsApplied, st.Capped)
	if st.Capped != 0 || st.HitsApplied != uint64(admitted) {
		t.Errorf("node 1 charged %d of the %d hits node 0 admitted (capped %d)", st.HitsApplied, admitted, st.Capped)
	}
}

// TestSlowReceiverCapsNothing: a node whose rounds run late (a starved
// process: its timer fires seconds late) still charges all its peer
// admits. The cap on the peer's reports refilled up to the receiver's
// last round, not its clock, so past burst+1 the peer's honest hits were
// discarded until the receiver's round caught up.
func TestSlowReceiverCapsNothing(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(1), 1, time.Second, false, 1)
	admitted := 0
	for range 30 {
		// Node 0 runs its rounds; node 1 only receives.
		c.clk.Advance(time.Second)
		if d, _ := c.lims[0].Allow(ctx, "k", 1); d.Allowed {
			admitted++
		}
		c.nodes[0].Tick()
		c.clk.Advance(c.interval / 50)
		c.net.Deliver()
	}
	st := c.nodes[1].Stats()
	t.Logf("node 0 admitted %d; node 1, its rounds 30 s late, charged %d and capped %d", admitted, st.HitsApplied, st.Capped)
	if st.Capped != 0 || st.HitsApplied+1 < uint64(admitted) {
		t.Errorf("node 1 charged %d of the %d hits node 0 admitted (capped %d)", st.HitsApplied, admitted, st.Capped)
	}
}
