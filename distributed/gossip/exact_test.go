package gossip

import (
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// overCarry asks for keys keys on each of 3 nodes at twice their rate
// for rounds rounds, each round carrying at most maxBytes of counters to
// a peer, and returns what the cluster admitted over the second half,
// over the rate of one bucket per key, and the rounds each node ran
// behind.
func overCarry(t *testing.T, keys, maxBytes, rounds int) (steady float64, behind []uint64) {
	rate, burst := throttle.PerSecond(2), 4
	c := newCluster(t, 3, rate, burst, time.Second, false, 1, func(cfg *Config) { cfg.MaxRoundBytes = maxBytes })
	c.runTo(c.clk.Now().Add(2 * time.Second))
	const per = 5 // asks per key, node and round
	var admitted int64
	var mid time.Time
	for i := range rounds * per {
		if i == rounds*per/2 {
			admitted, mid = 0, c.clk.Now()
		}
		for _, l := range c.lims {
			for k := range keys {
				if d, _ := l.Allow(ctx, "k"+strconv.Itoa(k), 1); d.Allowed {
					admitted++
				}
			}
		}
		c.runTo(c.clk.Now().Add(time.Second / per))
	}
	for _, n := range c.nodes {
		behind = append(behind, n.Stats().Behind)
	}
	return float64(admitted) / (float64(keys) * 2 * c.clk.Now().Sub(mid).Seconds()), behind
}

// TestExactBeyondWhatARoundCarries: with 15 times more counters changing
// every round than a round carries, the cluster's rate over the second
// half of a run (after the backlog formed) is the rate of one bucket per
// key, within 5%: every reported hit is charged, buckets going negative,
// however late the report. Stats.Behind counts the rounds that could not
// carry every change (the daemon logs them), so that an operator learns
// that charges lag (and the first burst of a key may be admitted on
// every node), and none when the rounds carry everything.
func TestExactBeyondWhatARoundCarries(t *testing.T) {
	steady, behind := overCarry(t, 500, MaxPacket, 150)
	t.Logf("500 keys changing every round, a round carrying about 35: steady state %.4f of the rate; rounds behind %v", steady, behind)
	if steady > 1.05 || steady < 0.9 {
		t.Errorf("steady state %.4f of one bucket's rate, want within [0.9, 1.05]", steady)
	}
	for i, b := range behind {
		if b < 100 {
			t.Errorf("node %d counted %d rounds behind of 150, each of which left counters out", i, b)
		}
	}
	if _, behind := overCarry(t, 20, defaultMaxRoundBytes, 20); behind[0]+behind[1]+behind[2] != 0 {
		t.Errorf("rounds carrying every change counted behind: %v", behind)
	}
}
