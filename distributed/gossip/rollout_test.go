package gossip

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// TestCapRolloutNoFreshBurst rolls a new limit out node by node with the
// spend cap: node 0 creates it, spends its whole burst on a key and
// reports it; nodes 1 and 2 create it three rounds later, once that report
// reached them, and are asked for the key at once. What the three nodes
// admitted, counted from their Allow decisions, must stay within the
// gossip-cap bound, burst + rate·t + N − 1 over the window: the later
// nodes must not start with a full bucket of the new limit.
func TestCapRolloutNoFreshBurst(t *testing.T) {
	const burst, nodes = 40, 3
	rate := throttle.PerSecond(5)
	c := newCluster(t, nodes, rate, burst, 100*time.Millisecond, true, 1)
	c.settle()
	start := c.clk.Now()
	first, err := c.nodes[0].NewLimiter("rollout", rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	ask := func(l *Limiter) int {
		n := 0
		for range 2 * burst {
			d, err := l.Allow(ctx, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		admitted += n
		return n
	}
	// Node 0 alone asks for the key every round until it has taken the
	// whole burst (its share of each round is what its peers, which do not
	// have the limit, leave it).
	took := 0
	for r := 0; took < burst && r < 20; r++ {
		took += ask(first)
		c.runTo(c.clk.Now().Add(c.interval))
	}
	if took < burst {
		t.Fatalf("node 0 took %d of the burst of %d in 20 rounds", took, burst)
	}
	// Three rounds: node 0's report of the key reaches the others, which
	// acknowledge it.
	c.runTo(c.clk.Now().Add(3 * c.interval))
	c.settle()
	later := make([]int, 0, nodes-1)
	for _, n := range c.nodes[1:] {
		l, err := n.NewLimiter("rollout", rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		later = append(later, ask(l))
	}
	elapsed := c.clk.Now().Sub(start)
	bound := float64(burst) + float64(rate.Events(elapsed)) + nodes - 1
	if float64(admitted) > bound {
		t.Fatalf("admitted %d over %v (node 0 %d, then the later nodes %v), against the bound %.1f: a later node started its bucket of the new limit full",
			admitted, elapsed, took, later, bound)
	}
	t.Logf("admitted %d over %v (node 0 %d, the later nodes %v), bound %.1f", admitted, elapsed, took, later, bound)
}

// TestEarlyReportsBounded: a peer that holds the secret floods a node with
// reports for limiters it does not have, under many names and many
// datagrams for one name. What the node keeps for them stays within
// earlyTables names of earlyBytes each (checked also on the heap); once
// the limiter is created, what is kept is charged through the cap, as
// much as one honest peer could have admitted; a new incarnation of the
// sender drops what its earlier one sent, what is not claimed is dropped
// after earlyRounds, and what a peer that left since sent is not charged.
func TestEarlyReportsBounded(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(10), 20, 100*time.Millisecond, false, 1)
	c.settle()
	n := c.nodes[1]
	inc := c.nodes[0].incarnation.Load()
	send := func(table string, inc uint64, keys int, hits uint64) {
		now := c.clk.Now().UnixNano()
		e := &encoder{hdr: header{typ: msgReport, sender: "n0", table: table, incarnation: inc, round: uint64(now / int64(c.interval)), start: now}}
		for k := range keys {
			e.addReport(reportEntry{key: fmt.Sprintf("%0200d", k), born: now - 1, hits: hits, demand: hits})
		}
		for _, p := range c.nodes[0].sealFor("n1", e.finish()) {
			inject(n, "n0", p)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 200 {
		send(fmt.Sprintf("t%d", i), inc, 6, 1)
	}
	for range 2000 {
		send("big", inc, 6, math.MaxInt64)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n.mu.Lock()
	tables, kept := len(n.early), 0
	for name, et := range n.early {
		if et.size > earlyBytes {
			t.Errorf("%d bytes kept for %q, want at most %d", et.size, name, earlyBytes)
		}
		kept += len(et.msgs)
	}
	n.mu.Unlock()
	if tables > earlyTables {
		t.Errorf("%d names kept, want at most %d", tables, earlyTables)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 2*earlyTables*earlyBytes {
		t.Errorf("the heap grew by %d bytes for %d messages kept, want at most %d", grew, kept, 2*earlyTables*earlyBytes)
	}
	t.Logf("kept %d messages under %d names; heap %+d bytes", kept, tables, int64(after.HeapAlloc)-int64(before.HeapAlloc))
	l, err := n.NewLimiter("big", throttle.PerSecond(10), 20)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("%0200d", 0)
	if tok := l.Tokens(key); tok >= 20 || tok < -10*8-20 {
		t.Errorf("the kept reports of MaxInt64 hits took the new limiter's bucket to %d tokens, want below 20 and capped at one peer's allowance", tok)
	}
	// A new life of the sender: what its earlier life sent is dropped.
	send("t199", inc, 1, 5)
	send("other", inc+1, 1, 5)
	n.mu.Lock()
	for name, et := range n.early {
		for _, p := range et.msgs {
			if p.m.incarnation < inc+1 {
				t.Errorf("a message of the sender's earlier life kept under %q", name)
			}
		}
	}
	n.mu.Unlock()
	c.runTo(c.clk.Now().Add((earlyRounds + 2) * c.interval))
	n.mu.Lock()
	if len(n.early) != 0 {
		t.Errorf("%d names still kept %d rounds later", len(n.early), earlyRounds+2)
	}
	n.mu.Unlock()
	// What a peer that left sent is not charged.
	send("gone", inc+2, 1, 5) // a life of its own: a window of sequence numbers of its own
	n.mu.Lock()
	goneKept := n.early["gone"] != nil
	n.mu.Unlock()
	if !goneKept {
		t.Fatal("a report for a limiter the node does not have was not kept")
	}
	n.Leave("n0")
	gone, err := n.NewLimiter("gone", throttle.PerSecond(10), 20)
	if err != nil {
		t.Fatal(err)
	}
	if tok := gone.Tokens(key); tok != 20 {
		t.Errorf("a report kept from a peer that left since took the new limiter's bucket to %d tokens, want 20", tok)
	}
}

// TestRolloutStateKept: a node that restarts catches up from its peers'
// bucket levels (states), sent for every limiter they have. When a new
// limit is being rolled out, the restarted node may not have it yet; the
// levels of it must be kept and taken when it creates the limiter, or a
// key its peer exhausted starts full there (the peer's counters born
// before the restart are baselines: only the level carries them).
func TestRolloutStateKept(t *testing.T) {
	const burst = 20
	rate := throttle.NewRate(1, time.Hour)
	c := newCluster(t, 2, rate, burst, 100*time.Millisecond, false, 1)
	c.settle()
	first, err := c.nodes[0].NewLimiter("rollout", rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	for range burst {
		if d, err := first.Allow(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	c.runTo(c.clk.Now().Add(3 * c.interval))
	c.restart(t, 1, rate, burst)
	c.runTo(c.clk.Now().Add(5 * c.interval))
	later, err := c.nodes[1].NewLimiter("rollout", rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	if tok := later.Tokens("k"); tok > 0 {
		t.Fatalf("the restarted node created the limit after its peer's levels of it arrived: %d tokens of a key its peer exhausted, want 0 (stats %+v)",
			tok, c.nodes[1].Stats())
	}
}
