package gossip

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// ring is a Keyring a test changes, as memberlist.Keyring is changed.
type ring struct {
	mu   sync.Mutex
	keys [][]byte
}

func newRing(keys ...[]byte) *ring { return &ring{keys: keys} }

func (r *ring) GetPrimaryKey() []byte { r.mu.Lock(); defer r.mu.Unlock(); return r.keys[0] }
func (r *ring) GetKeys() [][]byte     { r.mu.Lock(); defer r.mu.Unlock(); return r.keys }
func (r *ring) set(keys ...[]byte)    { r.mu.Lock(); r.keys = keys; r.mu.Unlock() }

var (
	key1 = bytes.Repeat([]byte{1}, 32)
	key2 = bytes.Repeat([]byte{2}, 16)
	key3 = bytes.Repeat([]byte{3}, 32)
)

// withSeal seals each node's transport under its own ring (by address),
// with no Secret.
func withSeal(rings map[string]*ring, seals map[string]*SealedTransport) func(*Config) {
	return func(c *Config) {
		addr := c.Transport.Addr()
		rings[addr] = newRing(key1)
		s, err := Seal(c.Transport, rings[addr])
		if err != nil {
			panic(err)
		}
		seals[addr] = s
		c.Transport, c.Secret = s, nil
	}
}

// sealedLoad drives a client at 3x the rate through a random node for d,
// rotating the keys as rotate says at each step, and returns how many
// were admitted.
func sealedLoad(t *testing.T, sealed bool, rotate func(c *cluster, rings map[string]*ring, step int)) (admitted int, c *cluster, seals map[string]*SealedTransport) {
	rings, seals := map[string]*ring{}, map[string]*SealedTransport{}
	var opts []func(*Config)
	if sealed {
		opts = append(opts, withSeal(rings, seals))
	}
	c = newCluster(t, 3, throttle.PerSecond(20), 40, time.Second, true, 1, opts...)
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 40 {
		if rotate != nil {
			rotate(c, rings, step)
		}
		for range 15 { // 60 a second: 3x the rate
			if d, _ := c.lims[rng.IntN(3)].Allow(ctx, "k", 1); d.Allowed {
				admitted++
			}
		}
		c.runTo(c.clk.Now().Add(250 * time.Millisecond))
	}
	return admitted, c, seals
}

// A key rotation under load (add the new key everywhere, make it primary
// everywhere, remove the old one) refuses no datagram and changes no
// decision: the cluster admits exactly what it admits unsealed.
func TestSealedRotationDropsNothing(t *testing.T) {
	plain, pc, _ := sealedLoad(t, false, nil)
	each := func(rings map[string]*ring, keys ...[]byte) {
		for _, r := range rings {
			r.set(keys...)
		}
	}
	got, c, seals := sealedLoad(t, true, func(c *cluster, rings map[string]*ring, step int) {
		switch step {
		case 10:
			each(rings, key1, key2)
		case 20:
			each(rings, key2, key1)
		case 30:
			each(rings, key2)
		}
	})
	if got != plain {
		t.Errorf("sealed with a rotation: admitted %d, unsealed %d", got, plain)
	}
	t.Logf("admitted %d sealed, %d unsealed; applied %d", got, plain, c.nodes[0].Stats().HitsApplied)
	// 10 s at 20/s plus the burst: what one bucket allows.
	if limit := 20*10 + 40; got > limit {
		t.Errorf("admitted %d, the limit is %d", got, limit)
	}
	for addr, s := range seals {
		if s.Refused() != 0 {
			t.Errorf("%s refused %d datagrams", addr, s.Refused())
		}
	}
	for i, n := range c.nodes {
		if st, ps := n.Stats(), pc.nodes[i].Stats(); st.HitsApplied != ps.HitsApplied || st.BadMAC != 0 {
			t.Errorf("node %d: %+v sealed, %+v unsealed", i, st, ps)
		}
	}
}

// Rotating out of order (one node seals under a key the others lack)
// is refused and counted, and heals once every node has the key.
func TestSealedUnknownKeyRefused(t *testing.T) {
	_, _, seals := sealedLoad(t, true, func(c *cluster, rings map[string]*ring, step int) {
		switch step {
		case 10:
			rings["n0"].set(key2, key1)
		case 20:
			rings["n1"].set(key1, key2)
			rings["n2"].set(key1, key2)
		}
	})
	if seals["n1"].Refused() == 0 || seals["n2"].Refused() == 0 || seals["n0"].Refused() != 0 {
		t.Fatalf("refused: n0 %d, n1 %d, n2 %d; want n0's datagrams under a key the others lacked refused",
			seals["n0"].Refused(), seals["n1"].Refused(), seals["n2"].Refused())
	}
}

// Forged, corrupted and unsealed datagrams are refused by the seal;
// sealed datagrams replayed are refused by the node.
func TestSealedForgedAndReplayed(t *testing.T) {
	taps := map[string]*tap{}
	rings, seals := map[string]*ring{}, map[string]*SealedTransport{}
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1, withTap(taps), withSeal(rings, seals))
	c.lims[0].Allow(ctx, "victim", 5)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	if tok := c.lims[1].Tokens("victim"); tok != 5 {
		t.Fatalf("n1 holds %d tokens, want 5", tok)
	}
	captured := taps["n0"].take("n1")
	attacker := c.net.Endpoint("n0") // the sender's address: the source check passes
	other, _ := Seal(attacker, newRing(key3))
	before := seals["n1"].Refused()
	for _, p := range captured {
		bad := bytes.Clone(p)
		bad[len(bad)-1] ^= 1
		attacker.Send("n1", bad)                          // corrupted tag
		attacker.Send("n1", bytes.Repeat([]byte{1}, 100)) // not sealed
		other.Send("n1", p[sealOverhead:])                // sealed under a key n1 lacks
	}
	c.runTo(c.clk.Now().Add(10 * time.Millisecond))
	if got := seals["n1"].Refused() - before; got != uint64(3*len(captured)) {
		t.Fatalf("refused %d of %d forged datagrams", got, 3*len(captured))
	}
	st := c.nodes[1].Stats()
	for _, p := range captured {
		attacker.Send("n1", p) // replayed, sealed under the right key
	}
	c.runTo(c.clk.Now().Add(10 * time.Millisecond))
	after := c.nodes[1].Stats()
	if tok := c.lims[1].Tokens("victim"); tok != 5 || after.HitsApplied != st.HitsApplied {
		t.Fatalf("after replays n1 holds %d tokens (want 5), applied %d -> %d", tok, st.HitsApplied, after.HitsApplied)
	}
	if got := after.Duplicate + after.Stale - st.Duplicate - st.Stale; got != uint64(len(captured)) {
		t.Fatalf("replays counted %d, want %d", got, len(captured))
	}
}

func TestSealRejectsBadKey(t *testing.T) {
	net := newNetwork(nil, 1)
	if _, err := Seal(net.Endpoint("a"), newRing([]byte("short"))); !errors.Is(err, errNoKey) || !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Seal with a 5-byte key: %v", err)
	}
	s, err := Seal(net.Endpoint("a"), newRing(key1))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Authenticated() {
		t.Fatal("a sealed transport does not say it authenticates its datagrams")
	}
	if _, err := NewNode(Config{Transport: s, Secret: []byte("short")}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("a short secret on a sealed transport: %v", err)
	}
	if _, err := NewNode(Config{Transport: net.Endpoint("b")}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("no secret on an unsealed transport: %v", err)
	}
}

// loopback is a Transport that hands what it sends to its listener.
type loopback struct{ h func([]byte, string) }

func (l *loopback) Addr() string                        { return "self" }
func (l *loopback) Send(addr string, p []byte) error    { l.h(p, addr); return nil }
func (l *loopback) Listen(h func([]byte, string)) error { l.h = h; return nil }
func (l *loopback) Close() error                        { return nil }

// BenchmarkSeal seals and opens one full datagram (MaxPacket bytes),
// with the ring holding two keys and the datagram under the second (the
// slowest open: mid-rotation).
func BenchmarkSeal(b *testing.B) {
	inner := &loopback{}
	sender, _ := Seal(inner, newRing(key2))
	receiver, _ := Seal(inner, newRing(key1, key2))
	got := 0
	receiver.Listen(func(p []byte, _ string) { got += len(p) })
	p := make([]byte, MaxPacket)
	b.SetBytes(MaxPacket)
	b.ReportAllocs()
	for b.Loop() {
		sender.Send("self", p)
	}
	if got != b.N*MaxPacket || receiver.Refused() != 0 {
		b.Fatalf("opened %d bytes of %d, refused %d", got, b.N*MaxPacket, receiver.Refused())
	}
}
