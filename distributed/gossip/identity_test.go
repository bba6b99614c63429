package gossip

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// restart closes node i and starts it again on the same address with the
// cluster's limiter, after the clock has moved on.
func (c *cluster) restart(t *testing.T, i int, rate throttle.Rate, burst int, opts ...func(*Config)) {
	t.Helper()
	c.nodes[i].Close()
	cfg := Config{Transport: c.net.Endpoint(c.addrs[i]), Secret: secret, Peers: c.addrs, Interval: c.interval}
	for _, o := range opts {
		o(&cfg)
	}
	c.nodes[i], c.lims[i] = newNode(t, cfg, rate, burst, throttle.WithClock(c.clk))
}

// TestReplayedOldHelloKeepsNodesTogether: after a rolling restart, a hello
// captured from a peer's previous life and replayed from its address names
// an older incarnation of the sender (and of the receiver): it changes
// nothing, and the hits of the peer's current life keep being charged.
func TestReplayedOldHelloKeepsNodesTogether(t *testing.T) {
	rate, burst := throttle.NewRate(1, time.Hour), 1000
	taps := map[string]*tap{}
	c := newCluster(t, 2, rate, burst, time.Second, false, 1, withTap(taps))
	c.runTo(c.clk.Now().Add(3 * time.Second))
	captured := taps["n0"].take("n1") // hellos: nothing to report
	if len(captured) == 0 {
		t.Fatal("nothing captured")
	}
	// A rolling restart: n0, then n1.
	c.clk.Advance(time.Second)
	c.restart(t, 0, rate, burst)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	c.restart(t, 1, rate, burst)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	for _, p := range captured {
		inject(c.nodes[1], "n0", p)
	}
	for range 10 {
		if d, err := c.lims[0].Allow(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		c.runTo(c.clk.Now().Add(time.Second))
	}
	c.runTo(c.clk.Now().Add(5 * time.Second))
	if tok := c.lims[1].Tokens("k"); tok != int64(burst-10) {
		t.Fatalf("after 10 hits on n0 and a replayed hello of its old life: n1 holds %d tokens, want %d (n1 stats %+v)",
			tok, burst-10, c.nodes[1].Stats())
	}
}
