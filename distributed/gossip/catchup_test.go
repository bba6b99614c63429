package gossip

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// restartReadmitted exhausts keys keys (rate 1/hour, burst 1) on node 0
// of a 3-node cluster whose receivers hold at most queue datagrams in
// flight (a receive buffer of about queue x 1.4 kB), waits until both
// peers have charged them, restarts node 2 and gives it rounds rounds to
// catch up; then it asks node 2 for every key once and returns how many
// it admitted: keys whose exhaustion its catch-up state lost.
func restartReadmitted(t *testing.T, keys, queue, rounds int) int {
	rate, burst := throttle.NewRate(1, time.Hour), 1
	c := newCluster(t, 3, rate, burst, time.Second, false, 1)
	c.net.SetQueueLimit(queue)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	key := func(i int) string { return "key-" + strconv.Itoa(i) }
	for i := range keys {
		c.lims[0].Allow(ctx, key(i), 1)
	}
	for r := 0; ; r++ {
		c.runTo(c.clk.Now().Add(time.Second))
		if c.nodes[1].Stats().HitsApplied >= uint64(keys) && c.nodes[2].Stats().HitsApplied >= uint64(keys) {
			break
		}
		if r == 200 {
			t.Fatalf("the peers did not charge the %d keys within 200 rounds", keys)
		}
	}
	c.nodes[2].Close()
	node, lim := newNode(t, Config{Transport: c.net.Endpoint("n2"), Secret: secret, Peers: c.addrs},
		rate, burst, throttle.WithClock(c.clk), throttle.WithMaxKeys(4*keys))
	c.nodes[2], c.lims[2] = node, lim
	caught, lifted := -1, -1
	for r := 1; r <= rounds; r++ {
		c.runTo(c.clk.Now().Add(time.Second))
		if lifted < 0 && !node.gated.Load() {
			lifted = r
		}
		left := 0
		for i := range keys {
			if lim.Tokens(key(i)) > 0 {
				left++
			}
		}
		if left == 0 && caught < 0 {
			caught = r
		}
	}
	t.Logf("caught up on every key after %d rounds, decided normally after %d (-1: not within %d)", caught, lifted, rounds)
	readmitted := 0
	for i := range keys {
		if d, _ := lim.Allow(ctx, key(i), 1); d.Allowed {
			readmitted++
		}
	}
	return readmitted
}

// TestRestartCatchUpAtScale: a node restarted while 200,000 keys are
// exhausted catches up on all of them through its peers' receive
// buffers (Linux's default, about 150 datagrams): its peers send their
// bucket levels a budget at a time, resuming where the acknowledged part
// ends, instead of all at once and never again. Before, most of the
// state was lost in the buffers and the keys were admitted again.
//
// The test runs a quarter of it (50,000 keys) to stay fast;
// THROTTLE_GOSSIP_LARGE=1 runs the full size.
func TestRestartCatchUpAtScale(t *testing.T) {
	keys, queue := 50_000, 150
	if race {
		keys, queue = 10_000, 30
	}
	if os.Getenv("THROTTLE_GOSSIP_LARGE") == "1" {
		keys = 200_000
	}
	rounds := 30 * max(keys/50_000, 1) // 24 rounds for 50,000 keys
	got := restartReadmitted(t, keys, queue, rounds)
	t.Logf("%d exhausted keys, receive queue %d datagrams: %d (%.2f%%) admitted again by the node restarted %d rounds earlier",
		keys, queue, got, 100*float64(got)/float64(keys), rounds)
	if got != 0 {
		t.Errorf("%d of %d exhausted keys admitted again after the restart, want 0", got, keys)
	}
}

// TestRestartConservativeBeforeCaughtUp: a node restarted while its
// peers hold keys exhausted decides them conservatively until it has
// caught up: asked ten rounds after the restart, before its peers have
// sent every level, it admits at most 1% of them again (a key's
// admissions in its new life stay within what a bucket empty at the
// restart would have refilled). Before, it decided every key whose level
// had not arrived yet on a full bucket: 20.6% of 200,000 keys were
// admitted again ten rounds after the restart.
//
// THROTTLE_GOSSIP_LARGE=1 runs it at 200,000 keys.
func TestRestartConservativeBeforeCaughtUp(t *testing.T) {
	keys, queue, rounds := 50_000, 150, 3
	if race {
		keys, queue = 10_000, 30
	}
	if os.Getenv("THROTTLE_GOSSIP_LARGE") == "1" {
		keys, rounds = 200_000, 10
	}
	got := restartReadmitted(t, keys, queue, rounds)
	t.Logf("%d exhausted keys: %d (%.2f%%) admitted again by the node restarted %d rounds earlier", keys, got, 100*float64(got)/float64(keys), rounds)
	if got > keys/100 {
		t.Errorf("%d of %d exhausted keys (%.1f%%) admitted again %d rounds after the restart, want at most 1%%", got, keys, 100*float64(got)/float64(keys), rounds)
	}
}

// TestRestartConservativeFromFirstDecision: a node restarted while its
// peers hold keys exhausted decides them conservatively from its first
// decision, before any datagram of a peer tells it that it restarted
// (the peers' next round is up to an interval away): asked at once, it
// admits none of them again. Before, it decided them on full buckets
// until the first datagram of a peer: every key was admitted again.
func TestRestartConservativeFromFirstDecision(t *testing.T) {
	keys := 5_000
	got := restartReadmitted(t, keys, 150, 0)
	t.Logf("%d exhausted keys asked at once of the node just restarted: %d (%.2f%%) admitted again", keys, got, 100*float64(got)/float64(keys))
	if got > keys/100 {
		t.Errorf("%d of %d exhausted keys (%.1f%%) admitted again at once after the restart, want at most 1%%", got, keys, 100*float64(got)/float64(keys))
	}
}

// TestFirstStartAdmitsBurst: at a first start of the whole cluster the
// start gate costs a node only the wait for its peers' first datagrams
// (Start runs a round at once): a fresh key is decided conservatively
// until they arrive, then gets its burst, with static peers and with a
// Membership alike. A configured member that never speaks holds the gate
// for startSilence intervals, no longer; with a Membership, until the
// membership reports it dead (here 3 s after the start): the membership
// tells a silent member from a slow one.
func TestFirstStartAdmitsBurst(t *testing.T) {
	const burst, dead = 10, 3 * time.Second
	for _, members := range []bool{false, true} {
		for _, silent := range []bool{false, true} {
			name := fmt.Sprintf("membership %v, silent member %v", members, silent)
			lifted, got := firstStart(t, burst, members, silent, dead)
			t.Logf("%s: decisions conservative for %v after the start, then a fresh key admitted %d of %d (burst %d)", name, lifted, got, 2*burst, burst)
			want := 10 * time.Millisecond
			switch {
			case silent && members:
				want = dead
			case silent:
				want = startSilence * time.Second
			}
			if lifted < 0 || lifted > want {
				t.Errorf("%s: the start gate lifted after %v, want at most %v", name, lifted, want)
			}
			if silent && members && lifted < dead {
				t.Errorf("%s: the start gate lifted after %v, before the membership reported the silent member dead at %v", name, lifted, dead)
			}
			if got != burst {
				t.Errorf("%s: a fresh key admitted %d once the gate lifted, want the burst %d", name, got, burst)
			}
		}
	}
}

// firstStart starts nodes n0 to n2 together (interval 1 s), the peers
// configured or, with members, reported by a Membership, with n3 among
// them if silent (never started; the membership reports it dead after
// dead). It returns when the start gate of n0 lifted (-1: not within 5 s)
// and how much of a fresh key n0 then admits of 2 x burst asks, after
// checking that it admits none before its peers' first datagrams.
func firstStart(t *testing.T, burst int, members, silent bool, dead time.Duration) (time.Duration, int) {
	clk := throttletest.NewClock()
	net := newNetwork(clk, 1)
	net.SetDelay(10*time.Millisecond, 0)
	addrs := []string{"n0", "n1", "n2"}
	if silent {
		addrs = append(addrs, "n3") // configured, never started
	}
	var nodes []*Node
	var lims []*Limiter
	var mss []*StaticMembership
	for _, a := range addrs[:3] {
		cfg := Config{Transport: net.Endpoint(a), Secret: secret, Peers: addrs}
		if members {
			ms := NewStaticMembership(Member{ID: a}, addrs...)
			cfg.Peers, cfg.Membership, mss = nil, ms, append(mss, ms)
		}
		n, l := newNode(t, cfg, throttle.NewRate(1, time.Minute), burst, throttle.WithClock(clk))
		t.Cleanup(func() { n.Close() })
		nodes, lims = append(nodes, n), append(lims, l)
	}
	start := clk.Now()
	flood := func(key string) (admitted int) {
		for range 2 * burst {
			if d, _ := lims[0].Allow(ctx, key, 1); d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for _, n := range nodes {
		n.Tick()
	}
	if got := flood("before"); got != 0 {
		t.Errorf("membership %v, silent member %v: %d admitted before the peers' first datagrams, want 0", members, silent, got)
	}
	lifted, reported := time.Duration(-1), false
	for clk.Now().Sub(start) < 5*time.Second {
		if d, ok := net.NextDue(); ok && d.Before(clk.Now().Add(10*time.Millisecond)) {
			clk.Set(d)
		} else {
			clk.Advance(10 * time.Millisecond)
		}
		if silent && !reported && clk.Now().Sub(start) >= dead {
			for _, ms := range mss {
				ms.update(MemberEvent{Kind: MemberDead, Member: Member{ID: "n3"}})
			}
			reported = true
		}
		net.Deliver()
		for _, n := range nodes {
			n.Tick()
		}
		if !nodes[0].gated.Load() {
			lifted = clk.Now().Sub(start)
			break
		}
	}
	return lifted, flood("after")
}

// restartSlow exhausts keys keys (rate 1/hour, burst 1) on node 0 of a
// 3-node cluster, waits until both peers have charged them, then
// restarts node 2 with a Membership reporting members (its failure
// detector may not report every peer yet), or with static peers if
// static (given to Join at once if members is nil), the network delaying
// every datagram by delay from then on. After wait it asks node 2 for
// every key once and returns how many it admitted, and the node.
func restartSlow(t *testing.T, keys int, static bool, members []string, delay, wait time.Duration) (int, *Node) {
	rate, burst := throttle.NewRate(1, time.Hour), 1
	c := newCluster(t, 3, rate, burst, time.Second, false, 1)
	key := func(i int) string { return "key-" + strconv.Itoa(i) }
	for i := range keys {
		c.lims[0].Allow(ctx, key(i), 1)
	}
	// Mid-interval, the last round's datagrams delivered: the peers' next
	// round, the first to tell node 2 it restarted, is half an interval
	// away, plus the delay.
	c.runTo(c.clk.Now().Add(3500 * time.Millisecond))
	if got := c.nodes[2].Stats().HitsApplied; got < uint64(keys) {
		t.Fatalf("node 2 charged %d of the %d keys before its restart", got, keys)
	}
	c.nodes[2].Close()
	c.net.SetDelay(delay, 0)
	cfg := Config{Transport: c.net.Endpoint("n2"), Secret: secret, Peers: c.addrs}
	switch {
	case !static:
		cfg.Peers, cfg.Membership = nil, NewStaticMembership(Member{ID: "n2"}, members...)
	case members == nil:
		cfg.Peers = nil
	}
	node, lim := newNode(t, cfg, rate, burst, throttle.WithClock(c.clk))
	if static && members == nil {
		for _, a := range c.addrs {
			if err := node.Join(a); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.nodes[2], c.lims[2] = node, lim
	c.runTo(c.clk.Now().Add(wait))
	readmitted := 0
	for i := range keys {
		if d, _ := lim.Allow(ctx, key(i), 1); d.Allowed {
			readmitted++
		}
	}
	return readmitted, node
}

// TestRestartConservativeWithMembership: a node restarted with a
// Membership decides the keys its peers exhausted conservatively from its
// first decision, when its membership reports no peer yet (a failure
// detector that has not reached them: they join it later), and when it
// reports them but their datagrams arrive later than the start gate's
// silence (a delay spike of 3 intervals): a member the membership reports
// alive is slow, not absent, so its silence does not lift the gate. With
// static peers likewise, as long as it heard none of them, and when they
// join it (Join) just after its start. Before, the first and the last
// admitted every key (no peer at the start, no gate), the others every
// key once the silence of 2 intervals was over.
func TestRestartConservativeWithMembership(t *testing.T) {
	const keys = 1_000
	for _, tc := range []struct {
		name    string
		static  bool
		members []string
		delay   time.Duration
		wait    time.Duration
	}{
		{"members reported later", false, nil, 10 * time.Millisecond, 0},
		{"members slower than the silence", false, []string{"n0", "n1"}, 3 * time.Second, 2500 * time.Millisecond},
		{"static peers slower than the silence", true, []string{"n0", "n1"}, 3 * time.Second, 2500 * time.Millisecond},
		{"static peers joined after the start", true, nil, 10 * time.Millisecond, 0},
	} {
		got, node := restartSlow(t, keys, tc.static, tc.members, tc.delay, tc.wait)
		t.Logf("%s: %d exhausted keys asked %v after the restart: %d admitted again", tc.name, keys, tc.wait, got)
		if got > keys/100 {
			t.Errorf("%s: %d of %d exhausted keys admitted again %v after the restart, want at most 1%%", tc.name, got, keys, tc.wait)
		}
		if !node.gated.Load() {
			t.Errorf("%s: not gated %v after the restart, before any peer was heard", tc.name, tc.wait)
		}
	}
}
