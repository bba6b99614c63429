package gossip

import (
	"bytes"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// tap records every datagram a transport sends, per destination.
type tap struct {
	Transport
	mu   sync.Mutex
	sent map[string][][]byte
}

func (t *tap) Send(addr string, p []byte) error {
	t.mu.Lock()
	if t.sent == nil {
		t.sent = map[string][][]byte{}
	}
	t.sent[addr] = append(t.sent[addr], bytes.Clone(p))
	t.mu.Unlock()
	return t.Transport.Send(addr, p)
}

func (t *tap) take(addr string) [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.sent[addr]
	t.sent[addr] = nil
	return p
}

func withTap(taps map[string]*tap) func(*Config) {
	return func(c *Config) {
		tp := &tap{Transport: c.Transport}
		taps[c.Transport.Addr()] = tp
		c.Transport = tp
	}
}

// Datagrams captured on the wire and replayed later, to their receiver
// or to another node, change no bucket.
func TestReplayedDatagramsAreRejected(t *testing.T) {
	taps := map[string]*tap{}
	c := newCluster(t, 3, throttle.PerSecond(10), 20, time.Second, false, 1, withTap(taps))
	for range 20 {
		c.lims[0].Allow(ctx, "victim", 1)
	}
	c.runTo(c.clk.Now().Add(2 * time.Second))
	captured := taps["n0"].take("n1")
	if len(captured) == 0 {
		t.Fatal("nothing captured")
	}
	// Eleven minutes later every bucket is full again and the counters
	// are forgotten.
	c.runTo(c.clk.Now().Add(11 * time.Minute))
	for i := 1; i < 3; i++ {
		if tok := c.lims[i].Tokens("victim"); tok != 20 {
			t.Fatalf("n%d: %d tokens before the replay", i, tok)
		}
	}
	for _, p := range captured {
		inject(c.nodes[1], "n0", p) // to the receiver
		inject(c.nodes[2], "n0", p) // to another node
	}
	for i := 1; i < 3; i++ {
		if tok := c.lims[i].Tokens("victim"); tok != 20 {
			t.Errorf("n%d: %d tokens after replaying %d datagrams, want 20", i, tok, len(captured))
		}
	}
	if st := c.nodes[1].Stats(); st.HitsApplied != 20 {
		t.Errorf("receiver stats %+v", st)
	}
}

// A peer that holds the secret cannot report more than it could have
// admitted, and an authentic datagram from the wrong source address is
// dropped.
func TestReportsAreCapped(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(10), 20, time.Second, false, 1)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	now := c.clk.Now()
	forge := func(hits uint64) [][]byte {
		n0 := c.nodes[0]
		b := n0.encode(msgReport, "api", now.UnixNano()/int64(time.Second), func(e *encoder) {
			e.addReport(reportEntry{key: "k", born: now.UnixNano() - int64(time.Second), hits: hits, demand: hits})
		})
		return n0.sealFor("n1", b)
	}
	for _, p := range forge(math.MaxInt64) {
		inject(c.nodes[1], "n0", p)
	}
	// At most burst + rate x (elapsed + one interval of slack) per round:
	// the full bucket (20) goes no lower than -rate x 5 rounds.
	if tok := c.lims[1].Tokens("k"); tok < -10*5 {
		t.Fatalf("one forged report took the bucket to %d tokens", tok)
	}
	if st := c.nodes[1].Stats(); st.Capped == 0 {
		t.Fatalf("stats %+v: want the excess counted in Capped", st)
	}
	// The same peer, from another address.
	c.runTo(c.clk.Now().Add(2 * time.Second))
	before := c.lims[1].Tokens("k2")
	now = c.clk.Now()
	b := c.nodes[0].encode(msgReport, "api", now.UnixNano()/int64(time.Second), func(e *encoder) {
		e.addReport(reportEntry{key: "k2", born: now.UnixNano(), hits: 5, demand: 5})
	})
	for _, p := range c.nodes[0].sealFor("n1", b) {
		inject(c.nodes[1], "evil", p)
	}
	if tok := c.lims[1].Tokens("k2"); tok != before {
		t.Fatalf("datagram from a foreign address applied: %d -> %d tokens", before, tok)
	}
	if st := c.nodes[1].Stats(); st.WrongSource != 1 {
		t.Fatalf("stats %+v: want WrongSource 1", st)
	}
}

// TestStatesAreCapped: a state of a level far below empty (forged by a
// peer that holds the secret) takes the bucket no lower than the reports
// of every member could, and the key is forgotten once it has refilled,
// not decades later.
func TestStatesAreCapped(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(10), 20, time.Second, false, 1)
	l := c.lims[1]
	// Two members, each report capped at burst + 12 rounds of refill + 1
	// (the retention of 10 rounds and 2 of slack).
	floor := int64(-2 * (20 + 10*12 + 1))
	for _, level := range []int64{math.MinInt64, math.MinInt64 / 2, -1 << 40} {
		m := &message{header: header{typ: msgState, sender: "n0", table: "api", incarnation: 7, round: 3},
			states: []stateEntry{{key: "k", tokens: level}}}
		if capped := l.applyState(m, l.node.tick.Load()); capped != floor-level {
			t.Fatalf("level %d: %d units capped, want %d", level, capped, floor-level)
		}
		if tok := l.Tokens("k"); tok != floor {
			t.Fatalf("level %d: the bucket holds %d tokens, want %d", level, tok, floor)
		}
	}
	// 302 tokens at 10 a second refill in 31 s; then the retention.
	start := c.clk.Now()
	c.runTo(start.Add(25 * time.Second))
	if l.table.load("k") == nil {
		t.Fatal("a key in debt is forgotten")
	}
	c.runTo(start.Add(60 * time.Second))
	if l.table.load("k") != nil {
		t.Fatalf("a key that refilled %v ago is still kept", 29*time.Second)
	}
}

// A node restarted after its clock was corrected backwards is a new
// incarnation to its peers, not a stale one.
func TestRestartAfterClockStepBack(t *testing.T) {
	clkA := throttletest.NewClock() // correct
	clkB := throttletest.NewClock() // an hour ahead, until corrected
	clkB.Advance(time.Hour)
	net := newNetwork(clkA, 1)
	peers := []string{"a", "b"}
	a, err := NewNode(Config{Transport: net.Endpoint("a"), Secret: secret, Peers: peers}, throttle.WithClock(clkA))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	la, _ := a.NewLimiter("api", throttle.NewRate(1, time.Hour), 100)
	b, err := NewNode(Config{Transport: net.Endpoint("b"), Secret: secret, Peers: peers}, throttle.WithClock(clkB))
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := b.NewLimiter("api", throttle.NewRate(1, time.Hour), 100)
	// Enough rounds for b, which started after a (in its clock), to
	// catch up and decide normally (see Node.gate).
	step := func(b *Node, clkB *throttletest.Clock) {
		for range 6 {
			clkA.Advance(time.Second)
			clkB.Advance(time.Second)
			a.Tick()
			b.Tick()
			clkA.Advance(20 * time.Millisecond)
			net.Deliver()
		}
	}
	step(b, clkB)
	lb.Allow(ctx, "k", 5)
	step(b, clkB)
	if tok := la.Tokens("k"); tok != 95 {
		t.Fatalf("before the restart: %d tokens", tok)
	}
	b.Close()
	// b's clock is corrected, and b restarts.
	b2, err := NewNode(Config{Transport: net.Endpoint("b"), Secret: secret, Peers: peers}, throttle.WithClock(clkA))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	lb2, _ := b2.NewLimiter("api", throttle.NewRate(1, time.Hour), 100)
	step(b2, clkA)
	lb2.Allow(ctx, "k", 7)
	step(b2, clkA)
	if tok := la.Tokens("k"); tok != 88 {
		t.Fatalf("after the restart: %d tokens, want 88 (stats %+v)", tok, a.Stats())
	}
}

// inject hands p to n as if it arrived from address from.
func inject(n *Node, from string, p []byte) { n.handle(p, from) }

// sealFor seals bodies as n would for peer addr: what an attacker with the
// secret can forge.
func (n *Node) sealFor(addr string, bodies [][]byte) [][]byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	pr := n.peers[addr]
	out := make([][]byte, len(bodies))
	for i, b := range bodies {
		pr.seq++
		out[i] = n.sendSig.seal(b, addr, header{part: uint16(i), parts: uint16(len(bodies)), seq: pr.seq, dstInc: pr.incarnation})
	}
	return out
}

// TestMintedCountersAreCapped: a peer that holds the secret and starts a
// new counter (a new born) in every datagram gains no fresh allowance by
// it: what it can charge a key stays what one honest peer could have
// admitted, and Stats.Capped saturates instead of wrapping.
func TestMintedCountersAreCapped(t *testing.T) {
	for _, restarts := range []bool{false, true} {
		c := newCluster(t, 2, throttle.PerSecond(10), 20, time.Second, false, 1)
		c.runTo(c.clk.Now().Add(3 * time.Second))
		now := c.clk.Now()
		inc := c.nodes[0].incarnation.Load()
		for i := range 21 {
			if restarts {
				inc++ // a new life in every datagram
			}
			e := &encoder{hdr: header{typ: msgReport, sender: "n0", table: "api", incarnation: inc, round: uint64(now.UnixNano() / int64(time.Second)), start: now.UnixNano()}}
			e.addReport(reportEntry{key: "k", born: now.UnixNano() - int64(time.Second) + int64(i), hits: math.MaxInt64, demand: math.MaxInt64})
			for _, p := range c.nodes[0].sealFor("n1", e.finish()) {
				inject(c.nodes[1], "n0", p)
			}
		}
		// One counter's allowance, burst + rate x (a few rounds + 2 of
		// slack), and one restart's burst.
		if tok := c.lims[1].Tokens("k"); tok < -10*8-20 {
			t.Errorf("restarts %v: 21 minted counters took the bucket to %d tokens", restarts, tok)
		}
		if st := c.nodes[1].Stats(); st.Capped != math.MaxUint64 {
			t.Errorf("restarts %v: Capped = %d after 21 reports of MaxInt64 hits, want it saturated at %d", restarts, st.Capped, uint64(math.MaxUint64))
		}
	}
}
