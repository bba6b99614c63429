package gossip

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// largeRoundUDP sends one hit on each of keys keys from a to b over real
// loopback UDP and returns the fraction of them b has charged after each
// of rounds rounds (virtual clock, rounds driven by hand, a real socket).
func largeRoundUDP(t testing.TB, keys, rounds int) []float64 {
	clk := throttletest.NewClock()
	a, b, _, _ := udpNodes(t, throttle.WithClock(clk), throttle.WithMaxKeys(2*keys))
	la, _ := a.NewLimiter("api", throttle.NewRate(1, time.Hour), 10)
	b.NewLimiter("api", throttle.NewRate(1, time.Hour), 10)
	// Introduce the nodes to each other first.
	clk.Advance(time.Second)
	a.Tick()
	b.Tick()
	// Wait until each has heard the other (bounded): hits made while a
	// node is still joining are the join's business, not this test's.
	for deadline := time.Now().Add(2 * time.Second); a.Stats().PacketsReceived == 0 || b.Stats().PacketsReceived == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the nodes did not hear each other within 2 s over loopback")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := range keys {
		la.Allow(ctx, "key-"+strconv.Itoa(i), 1)
	}
	var out []float64
	for range rounds {
		clk.Advance(time.Second)
		a.Tick()
		b.Tick()
		// Wait until b has every hit, or has received nothing for 150 ms
		// (on a loaded host its receiver can stall for tens of ms: a
		// single 30 ms pause once ended the wait with 0 of 100,000).
		last, quiet := b.Stats().PacketsReceived+b.Stats().Duplicate, 0
		for quiet < 5 && b.Stats().HitsApplied < uint64(keys) {
			time.Sleep(30 * time.Millisecond)
			s := b.Stats()
			if now := s.PacketsReceived + s.Duplicate; now == last {
				quiet++
			} else {
				last, quiet = now, 0
			}
		}
		out = append(out, float64(b.Stats().HitsApplied)/float64(keys))
	}
	return out
}

func TestLargeRoundOverUDP(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	keys := 100_000
	if race {
		keys = 20_000 // the race detector slows the receiver down
	}
	got := largeRoundUDP(t, keys, 4)
	t.Logf("%d keys over loopback UDP: fraction charged after each round %v", keys, got)
	if got[len(got)-1] != 1 {
		t.Fatalf("%d keys over loopback UDP: %v of the hits charged after %d rounds", keys, got[len(got)-1], len(got))
	}
}

// largeRoundSim: one hit on each of keys keys on node 0 of a 3-node
// cluster whose receivers hold at most queue datagrams in flight (a
// receive buffer of about queue x 1.4 kB), and 2% random loss on top;
// it returns the number of rounds until every peer charged every hit.
func largeRoundSim(t testing.TB, keys, queue int, maxRounds int) (rounds int, charged float64) {
	c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 10, time.Second, false, 1)
	c.net.SetQueueLimit(queue)
	c.net.SetLoss(0.02)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	base := c.nodes[1].Stats().HitsApplied
	for i := range keys {
		c.lims[0].Allow(ctx, "key-"+strconv.Itoa(i), 1)
	}
	for rounds = 1; rounds <= maxRounds; rounds++ {
		c.runTo(c.clk.Now().Add(time.Second))
		done := true
		for _, n := range c.nodes[1:] {
			if n.Stats().HitsApplied-base < uint64(keys) {
				done = false
			}
		}
		if done {
			return rounds, 1
		}
	}
	return rounds, float64(c.nodes[1].Stats().HitsApplied-base) / float64(keys)
}

// 100,000 keys in one round through receive buffers of 212,992 bytes
// (Linux's default, about 150 datagrams): every hit is charged on every
// peer, within a bounded number of rounds.
//
// The test runs a fifth of it (20,000 keys, 30 datagrams) to stay fast;
// THROTTLE_GOSSIP_LARGE=1 runs the full size.
func TestLargeRoundSim(t *testing.T) {
	keys, queue := 20_000, 30
	if race {
		keys, queue = 5_000, 8
	}
	if os.Getenv("THROTTLE_GOSSIP_LARGE") == "1" {
		keys, queue = 100_000, 150
	}
	rounds, charged := largeRoundSim(t, keys, queue, 80)
	t.Logf("%d keys, receive queue %d datagrams, 2%% loss: all charged after %d rounds (charged %.4f)", keys, queue, rounds, charged)
	if charged < 1 {
		t.Fatalf("after %d rounds only %.2f%% of the hits were charged", rounds, 100*charged)
	}
}

// A flood of new keys on one node (more than its peers' receive buffers
// take in a round) does not starve the keys in use: their hits are still
// charged on the peers within two rounds, and once the flood stops the
// backlog drains.
func TestJunkFloodDoesNotStarveGossip(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 1000, time.Second, false, 1)
	flood, queue := 3000, 20
	if race {
		flood, queue = 600, 4
	}
	c.net.SetQueueLimit(queue)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	junk := 0
	for round := range 10 {
		for range flood {
			c.lims[0].Allow(ctx, "junk-"+strconv.Itoa(junk), 1)
			junk++
		}
		c.lims[0].Allow(ctx, "victim", 5)
		c.runTo(c.clk.Now().Add(time.Second))
		if round >= 1 {
			// Charged for all but the last round's 5.
			if tok := c.lims[1].Tokens("victim"); tok > 1000-5*int64(round) {
				t.Fatalf("round %d of the flood: the peer holds %d tokens for victim; its hits are starved", round, tok)
			}
		}
	}
	c.runTo(c.clk.Now().Add(80 * time.Second))
	if got := c.nodes[1].Stats().HitsApplied; got != uint64(junk+50) {
		t.Fatalf("after the flood: %d hits charged, want %d", got, junk+50)
	}
}

// TestLateRoundsDoNotScanTheTable: a node whose rounds run seconds apart
// (a starved process, its timer late) builds its peer's reports from the
// changes of its last rounds, not from a scan of every key: the changes
// were kept for the last Resend+4 round numbers, not rounds run, so with
// rounds 10 s apart the peer's acknowledged round was always older than
// them and every round scanned (and sorted) the whole table, which made
// rounds at 1,000,000 keys slower still.
func TestLateRoundsDoNotScanTheTable(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 10, time.Second, false, 1)
	for i := range 5000 {
		c.lims[0].Allow(ctx, "key-"+strconv.Itoa(i), 1)
	}
	for range 3 {
		c.runTo(c.clk.Now().Add(time.Second))
	}
	c.lims[0].histMu.Lock()
	before := c.lims[0].scans
	c.lims[0].histMu.Unlock()
	for i := range 10 {
		c.lims[0].Allow(ctx, "key-"+strconv.Itoa(i), 1)
		c.clk.Advance(10 * time.Second) // the rounds between are not run
		for range 2 {
			for _, n := range c.nodes {
				n.Tick()
			}
			c.clk.Advance(c.interval / 50)
			c.net.Deliver()
		}
	}
	c.lims[0].histMu.Lock()
	scans := c.lims[0].scans - before
	c.lims[0].histMu.Unlock()
	if scans != 0 {
		t.Errorf("%d of 10 rounds run 10 s apart scanned the whole table", scans)
	}
	if got := c.nodes[1].Stats().HitsApplied; got != 5010 {
		t.Errorf("the peer charged %d hits, want 5010", got)
	}
}

// A round cut at its budget (a backlog of new keys) carries as many
// distinct counters as the budget holds: the busiest counters it carries
// first are taken from those past the part it sends in order anyway.
// Before, they were the first of the order, which the round then sent
// again: 50,000 keys hit once, the round cut at 84% of their entries,
// reached the peer 63% in the first round.
func TestCutRoundCarriesDistinctCounters(t *testing.T) {
	keys := 50_000
	if race {
		keys = 10_000
	}
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 10, time.Second, false, 1, func(cfg *Config) {
		cfg.MaxRoundBytes = keys * 21 // about two thirds of the keys' entries
	})
	c.runTo(c.clk.Now().Add(2 * time.Second))
	base := c.nodes[1].Stats().HitsApplied
	for i := range keys {
		c.lims[0].Allow(ctx, "key-"+strconv.Itoa(i), 1)
	}
	c.runTo(c.clk.Now().Add(time.Second + 100*time.Millisecond)) // one round, delivered
	got := float64(c.nodes[1].Stats().HitsApplied-base) / float64(keys)
	t.Logf("%d keys hit once, a round's budget about 84%% of their entries: %.4f charged after one round", keys, got)
	if got < 0.8 {
		t.Errorf("%.4f of the hits charged after the first round, want the budget's 0.8 or more", got)
	}
}
