package gossip

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// floodPeak floods one fresh key on every node of a spend-capped cluster
// (rate 50/s, burst 100, 1 s interval, reports delayed by delay), one
// request per node every millisecond for dur, and returns the peak burst:
// the most the cluster admitted in any window beyond rate x the window.
// One bucket's is burst.
func floodPeak(t *testing.T, nodes int, delay, dur time.Duration) (peak float64, worstRound int64) {
	rate, burst := throttle.PerSecond(50), 100
	c := newCluster(t, nodes, rate, burst, time.Second, true, 1)
	c.net.SetDelay(delay, 0)
	iv := int64(c.interval)
	c.runTo(time.Unix(0, (c.clk.Now().UnixNano()/iv+1)*iv).Add(time.Millisecond))
	start := c.clk.Now()
	perSec := 50.0
	k, minBase := 0.0, 0.0
	var round, inRound int64
	for at := start; at.Before(start.Add(dur)); at = at.Add(time.Millisecond) {
		c.runTo(at)
		if r := at.UnixNano() / iv; r != round {
			round, inRound = r, 0
		}
		for _, l := range c.lims {
			if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
				x := at.Sub(start).Seconds() * perSec
				minBase = min(minBase, k-x)
				k++
				inRound++
				peak = max(peak, k-x-minBase)
			}
		}
		if at.Sub(start) >= time.Second {
			worstRound = max(worstRound, inRound)
		}
	}
	return peak, worstRound
}

// TestCapBurstUnderDelay: with the spend cap, a flood of a fresh key on
// every node stays within one bucket's burst (plus one unit per node for
// rounding) while the first reports are in flight, not N times it.
func TestCapBurstUnderDelay(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		delay time.Duration
	}{{4, 10 * time.Millisecond}, {8, 10 * time.Millisecond}, {4, 100 * time.Millisecond}} {
		t.Run(fmt.Sprintf("nodes=%d/delay=%v", tc.nodes, tc.delay), func(t *testing.T) {
			peak, worst := floodPeak(t, tc.nodes, tc.delay, 4*time.Second)
			t.Logf("%d nodes, reports delayed %v: peak burst %.0f (one bucket: 100), at most %d admitted in a later round (one bucket: 50)", tc.nodes, tc.delay, peak, worst)
			if bound := float64(100 + tc.nodes - 1); peak > bound {
				t.Errorf("peak burst %.0f, want at most burst + N-1 = %.0f", peak, bound)
			}
		})
	}
}

// TestCapBurstAfterIdle: a key asked for on every node, idle for 2 s (10
// rounds) and then flooded again on every node stays within burst +
// rate·t + N-1 in any window. A peer weighed its demand averaged over the
// rounds since its report before, 1/10 of what it weighed itself by, so
// that each node took most of the tokens left for itself: 3 nodes
// admitted a peak burst of 10 against 8.
func TestCapBurstAfterIdle(t *testing.T) {
	const nodes, burst, perSec = 3, 6, 8.0
	c := newCluster(t, nodes, throttle.PerSecond(perSec), burst, 200*time.Millisecond, true, 1)
	iv := int64(c.interval)
	ask := func(from time.Time, dur time.Duration, each func(at time.Time, admitted bool)) {
		for at := from; at.Before(from.Add(dur)); at = at.Add(10 * time.Millisecond) {
			c.runTo(at)
			for _, l := range c.lims {
				d, err := l.Allow(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				each(at, d.Allowed)
			}
		}
	}
	start := time.Unix(0, (c.clk.Now().UnixNano()/iv+1)*iv).Add(time.Millisecond)
	ask(start, time.Second, func(time.Time, bool) {})
	start = start.Add(3 * time.Second) // the bucket full again, every report in
	k, minBase, peak := 0.0, 0.0, 0.0
	ask(start, 2*time.Second, func(at time.Time, admitted bool) {
		if admitted {
			x := at.Sub(start).Seconds() * perSec
			minBase = min(minBase, k-x)
			k++
			peak = max(peak, k-x-minBase)
		}
	})
	t.Logf("peak burst %.1f, %.0f admitted in 2 s", peak, k)
	if bound := float64(burst + nodes - 1); peak > bound {
		t.Errorf("peak burst %.1f after an idle key is asked for again, want at most burst + N-1 = %.0f", peak, bound)
	}
}
