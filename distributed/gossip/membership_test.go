package gossip

import (
	"bytes"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/throttletest"
)

// A node that joins a running cluster catches up: the peers send it their
// bucket levels, and from then on it is charged their hits.
func TestJoinCatchesUp(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1)
	for range 8 {
		c.lims[0].Allow(ctx, "alice", 1)
	}
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[1].Tokens("alice"); tok != 2 {
		t.Fatalf("peer holds %d tokens, want 2", tok)
	}
	// A third node joins, later.
	lim := c.join(t, "n2")
	if tok := lim.Tokens("alice"); tok != 10 {
		t.Fatalf("fresh node holds %d tokens", tok)
	}
	c.runTo(c.clk.Now().Add(2 * time.Second))
	if tok := lim.Tokens("alice"); tok != 2 {
		t.Fatalf("after joining, the new node holds %d tokens for alice, want the cluster's 2", tok)
	}
	// And it is charged new hits, once.
	c.lims[1].Allow(ctx, "alice", 1)
	c.runTo(c.clk.Now().Add(5 * time.Second))
	if tok := lim.Tokens("alice"); tok != 1 {
		t.Fatalf("after one more hit elsewhere: %d tokens, want 1", tok)
	}
	if got := c.nodes[0].Peers(); len(got) != 2 || got[1] != "n2" {
		t.Fatalf("Peers() = %v", got)
	}
}

// After Leave, a former peer's reports are dropped.
func TestLeave(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1)
	c.nodes[1].Leave("n0")
	c.lims[0].Allow(ctx, "bob", 5)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[1].Tokens("bob"); tok != 10 {
		t.Fatalf("a node charged a departed peer's hits: %d tokens", tok)
	}
	if st := c.nodes[1].Stats(); st.UnknownSender == 0 {
		t.Fatalf("stats %+v: want datagrams from the departed peer counted", st)
	}
	if tok := c.lims[0].Tokens("bob"); tok != 5 {
		t.Fatalf("the departed node itself: %d tokens", tok)
	}
}

// A peer left out and joined again in the same life (a reload of the
// peers list) is heard again: the sequence numbers this node sends it go
// on from those of before, which the peer, that never left this node out,
// still remembers (a count restarted from 0 was dropped as replayed).
func TestLeaveAndJoinAgainIsHeard(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 100, time.Second, false, 1)
	c.runTo(c.clk.Now().Add(30 * time.Second))
	c.nodes[0].Leave("n1")
	c.runTo(c.clk.Now().Add(10 * time.Second)) // n1 takes n0 for dead
	if err := c.nodes[0].Join("n1"); err != nil {
		t.Fatal(err)
	}
	c.runTo(c.clk.Now().Add(5 * time.Second))
	before := c.nodes[1].Stats()
	c.lims[0].Allow(ctx, "k", 10)
	c.runTo(c.clk.Now().Add(5 * time.Second))
	if tok := c.lims[1].Tokens("k"); tok != 90 {
		st := c.nodes[1].Stats()
		t.Fatalf("n1 holds %d tokens after n0 took 10, want 90 (n1 dropped %d datagrams as replayed meanwhile)", tok, st.Duplicate+st.Stale-before.Duplicate-before.Stale)
	}
	if m := *c.nodes[1].members.Load(); len(m) != 2 {
		t.Fatalf("n1's members %v: n0 taken for dead", m)
	}
}

// A restarted peer (new incarnation) is counted from zero again; the
// counters of its previous life are not charged twice.
func TestPeerRestart(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 100, time.Second, false, 1)
	c.lims[0].Allow(ctx, "k", 10)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	if tok := c.lims[1].Tokens("k"); tok != 90 {
		t.Fatalf("before the restart: %d", tok)
	}
	oldInc := c.nodes[0].incarnation.Load()
	c.nodes[0].Close()
	c.runTo(c.clk.Now().Add(3 * time.Second))
	node, err := NewNode(Config{Transport: c.net.Endpoint("n0"), Secret: secret, Peers: c.addrs}, throttle.WithClock(c.clk))
	if err != nil {
		t.Fatal(err)
	}
	lim, _ := node.NewLimiter("api", throttle.NewRate(1, time.Hour), 100)
	c.nodes[0], c.lims[0] = node, lim
	// It decides conservatively until it has caught up (see Node.gate).
	if d, _ := lim.Allow(ctx, "k", 3); d.Allowed {
		t.Fatal("the restarted node admitted 3 units before hearing from its peer")
	}
	for r := 0; node.gated.Load(); r++ {
		if r == 10 {
			t.Fatal("the restarted node has not caught up within 10 rounds")
		}
		c.runTo(c.clk.Now().Add(time.Second))
	}
	lim.Allow(ctx, "k", 3)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[1].Tokens("k"); tok != 87 {
		t.Fatalf("after the restart and 3 more hits: %d tokens, want 87", tok)
	}
	// The restarted node caught up from its peer: 100 - 10 - 3.
	if tok := lim.Tokens("k"); tok != 87 {
		t.Fatalf("restarted node: %d tokens, want 87", tok)
	}
	// An old datagram from the previous life is stale.
	e := &encoder{hdr: header{typ: msgReport, sender: "n0", table: "api", incarnation: oldInc, round: 1}}
	e.addReport(reportEntry{key: "k", born: 1, hits: 50, demand: 50})
	old := newSigner(secret).seal(e.finish()[0], "n1", header{parts: 1, seq: 99999})
	c.nodes[1].handle(old, "n0")
	if st := c.nodes[1].Stats(); st.Stale != 1 {
		t.Fatalf("stats %+v: want the old incarnation's datagram counted stale", st)
	}
}

func TestUDPTransport(t *testing.T) {
	clk := throttletest.NewClock()
	a, b, ta, tb := udpNodes(t, throttle.WithClock(clk))
	la, _ := a.NewLimiter("api", throttle.NewRate(1, time.Hour), 1000)
	lb, _ := b.NewLimiter("api", throttle.NewRate(1, time.Hour), 1000)
	// Many keys: the report spans several datagrams.
	for i := range 300 {
		la.Allow(ctx, "key-"+string(rune('a'+i%26))+string(rune('a'+i/26)), 2)
	}
	clk.Advance(time.Second)
	a.Tick()
	waitFor(t, func() bool { return b.Stats().HitsApplied == 600 })
	if st := a.Stats(); st.PacketsSent < 2 {
		t.Fatalf("300 keys went in %d datagram(s)", st.PacketsSent)
	}
	if tok := lb.Tokens("key-aa"); tok != 998 {
		t.Fatalf("b holds %d tokens for key-aa, want 998", tok)
	}
	// Garbage and oversized datagrams are dropped and counted.
	ta.Send(tb.Addr(), []byte("hello?"))
	ta.Send(tb.Addr(), bytes.Repeat([]byte{'T'}, 3000))
	waitFor(t, func() bool { return b.Stats().Malformed == 2 })
}

// udpNodes makes two nodes with opts, each the other's peer over its own
// loopback UDP socket, closed at the end of the test; it skips t without
// UDP on loopback.
func udpNodes(t testing.TB, opts ...throttle.Option) (a, b *Node, ta, tb Transport) {
	t.Helper()
	ta, err := ListenUDP("127.0.0.1:0")
	if err != nil {
		t.Skipf("no UDP on loopback: %v", err)
	}
	tb, err = ListenUDP("127.0.0.1:0")
	if err != nil {
		ta.Close()
		t.Skipf("no UDP on loopback: %v", err)
	}
	a, err = NewNode(Config{Transport: ta, Secret: secret, Peers: []string{tb.Addr()}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = NewNode(Config{Transport: tb, Secret: secret, Peers: []string{ta.Addr()}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Their first rounds: until a node has heard its peer start with it,
	// it decides conservatively (see Node.gateStart).
	a.Tick()
	b.Tick()
	testproc.Eventually(t, 10*time.Second, func() bool { return !a.gated.Load() && !b.gated.Load() })
	return a, b, ta, tb
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testproc.Eventually(t, 10*time.Second, cond)
}

// Gossip traffic grows with the keys seen per interval, not with the
// requests.
func TestTrafficProportionalToKeys(t *testing.T) {
	bytesFor := func(requests int) uint64 {
		c := newCluster(t, 2, throttle.PerSecond(1000), 1000000, time.Second, false, 1)
		before := c.nodes[0].Stats().BytesSent
		for i := range requests {
			c.lims[0].Allow(ctx, "key-"+string(rune('a'+i%3)), 1)
		}
		c.runTo(c.clk.Now().Add(time.Second))
		return c.nodes[0].Stats().BytesSent - before
	}
	few, many := bytesFor(30), bytesFor(30000)
	if many > few+16 { // varints of larger counters take a few more bytes
		t.Fatalf("one round with 3 keys: %d bytes for 30 requests, %d for 30000", few, many)
	}
}

// Decisions do not allocate, admitted or denied, with or without the cap.
func TestAllowDoesNotAllocate(t *testing.T) {
	if race {
		t.Skip("the race detector allocates")
	}
	for _, capped := range []bool{false, true} {
		c := newCluster(t, 3, throttle.PerSecond(1), 5, time.Second, capped, 1)
		l := c.lims[0]
		l.Allow(ctx, "k", 1) // create the key
		if n := testing.AllocsPerRun(100, func() { l.Allow(ctx, "k", 1) }); n != 0 {
			t.Errorf("cap=%v: %v allocations per decision", capped, n)
		}
	}
	// More members than fit on the stack, and a quota computed afresh at
	// every decision (the refill changes the total every nanosecond).
	c := newCluster(t, 20, throttle.PerSecond(1e9), 1e9, time.Second, true, 1)
	l := c.lims[0]
	l.Allow(ctx, "k", 1)
	if n := testing.AllocsPerRun(100, func() { c.clk.Advance(time.Microsecond); l.Allow(ctx, "k", 1) }); n != 0 {
		t.Errorf("20 members: %v allocations per decision", n)
	}
}

// A node that joins charges a peer's hits once, also those made within
// the interval before it started listening (which its clock-skew
// allowance takes as news) and that the peer's bucket levels, sent to it
// on joining, already include. They used to be charged twice.
func TestJoinChargesRecentHitsOnce(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	for range 4 {
		c.lims[0].Allow(ctx, "carol", 1)
	}
	c.clk.Advance(500 * time.Millisecond) // the counter is born half an interval before the join
	lim := c.join(t, "n2")
	c.runTo(c.clk.Now().Add(5 * time.Second))
	if tok := lim.Tokens("carol"); tok != 6 {
		t.Fatalf("the new node holds %d tokens for carol after 4 hits elsewhere, want 6", tok)
	}
}

// TestStateThenReportChargesOnce: when a peer's bucket levels arrive before
// its report of a counter born just before this node listened (news, by
// the clock-skew allowance), the hits the levels include are not charged
// again by the report; in the other order nothing is charged twice either.
func TestStateThenReportChargesOnce(t *testing.T) {
	for _, stateFirst := range []bool{true, false} {
		c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1)
		l := c.lims[1]
		born := c.clk.Now().UnixNano()
		state := &message{header: header{typ: msgState, sender: "n0", table: "api", incarnation: 7, round: 3},
			states: []stateEntry{{key: "carol", tokens: 6, born: born, mine: 4}}}
		report := &message{header: header{typ: msgReport, sender: "n0", table: "api", incarnation: 7, round: 3},
			reports: []reportEntry{{key: "carol", born: born, hits: 4, demand: 4}}}
		if stateFirst {
			l.applyState(state, 3)
			l.applyReport(report, born-1, 3)
		} else {
			l.applyReport(report, born-1, 3)
			l.applyState(state, 3)
		}
		if tok := l.Tokens("carol"); tok != 6 {
			t.Errorf("state first %v: %d tokens after 4 hits elsewhere, want 6", stateFirst, tok)
		}
		// Later hits of the same counter are charged, once.
		report.reports[0].hits, report.round = 5, 4
		l.applyReport(report, born-1, 4)
		if tok := l.Tokens("carol"); tok != 5 {
			t.Errorf("state first %v: %d tokens after a 5th hit, want 5", stateFirst, tok)
		}
	}
}

// join starts a node at addr with the cluster's limiter ("api", 1 per
// minute, burst 10), knowing every member, and has every member join it.
func (c *cluster) join(t *testing.T, addr string) *Limiter {
	t.Helper()
	node, err := NewNode(Config{Transport: c.net.Endpoint(addr), Secret: secret, Peers: c.addrs}, throttle.WithClock(c.clk))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := node.NewLimiter("api", throttle.NewRate(1, time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		if err := n.Join(addr); err != nil {
			t.Fatal(err)
		}
	}
	c.nodes, c.lims, c.addrs = append(c.nodes, node), append(c.lims, lim), append(c.addrs, addr)
	return lim
}

// TestSharesFollowReports: with the spend cap a key's entry keeps the
// shares its quota is divided by for the round, and a report arriving
// mid-round must replace them: the next quota is the one computed afresh.
func TestSharesFollowReports(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(1000), 1000, time.Second, true, 1)
	l := c.lims[1]
	if _, err := l.Allow(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	e := l.table.load("k")
	r := c.clk.Now().UnixNano() / int64(time.Second)
	quota := func() int64 {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.begin(r)
		return l.quota(l.shares(e, l.node.members.Load(), r), "k", r, 1000)
	}
	before := quota() // with no report from n0 yet: computed and kept
	born := c.clk.Now().UnixNano() - 1
	for i, demand := range []uint64{0, 900} { // n0 asks for 900 a round
		rep := &message{header: header{typ: msgReport, sender: "n0", table: "api", incarnation: 7, round: uint64(r - 1 + int64(i))},
			reports: []reportEntry{{key: "k", born: born, hits: 0, demand: demand}}}
		l.applyReport(rep, born-1, l.node.tick.Load())
	}
	got := quota()
	e.mu.Lock()
	e.cap.shares.members = nil
	e.mu.Unlock()
	if want := quota(); got != want || got == before {
		t.Fatalf("quota %d after n0's reports, %d before them; computed afresh: %d", got, before, want)
	}
}

// TestDeadPeerLeavesShares: with the spend cap, a peer unheard for a few
// intervals (killed, or cut off) no longer holds a share of a fresh key's
// burst; once it speaks again it is back in the shares.
func TestDeadPeerLeavesShares(t *testing.T) {
	c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 9, time.Second, true, 1)
	c.settle()
	if got := c.flood("a"); got != 3 {
		t.Fatalf("three live members: admitted %d of 9, want 3", got)
	}
	c.net.Partition([]string{"n2"})
	c.runTo(c.clk.Now().Add(time.Duration(c.nodes[0].deadAfter()) + 2*time.Second))
	c.settle()
	if got := c.flood("b"); got < 4 {
		t.Fatalf("n2 unheard for %v: admitted %d of 9 on a fresh key, want half of it (n2's share goes to the live)", time.Duration(c.nodes[0].deadAfter()), got)
	}
	c.net.Heal()
	c.runTo(c.clk.Now().Add(2 * time.Second))
	c.settle()
	if got := c.flood("c"); got != 3 {
		t.Fatalf("n2 back: admitted %d of 9, want 3", got)
	}
}
