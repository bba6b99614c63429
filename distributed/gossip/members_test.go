package gossip

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// withMembership gives each node a StaticMembership of the others,
// recorded by address, instead of Config.Peers.
func withMembership(ms map[string]*StaticMembership) func(*Config) {
	return func(c *Config) {
		m := NewStaticMembership(Member{}, c.Peers...)
		ms[c.Transport.Addr()] = m
		c.Membership, c.Peers = m, nil
	}
}

// flood asks node 0 for 20 units of key, one at a time, and returns how
// many it admitted.
func (c *cluster) flood(key string) (admitted int) {
	for range 20 {
		if d, _ := c.lims[0].Allow(ctx, key, 1); d.Allowed {
			admitted++
		}
	}
	return admitted
}

// A member the membership declares dead leaves the spend-cap shares at
// once, not after Resend+3 silent intervals; it stays a peer, and joins
// the shares again when the membership says it is alive.
func TestDeadMemberLeavesSharesAtOnce(t *testing.T) {
	ms := map[string]*StaticMembership{}
	c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 9, time.Second, true, 1, withMembership(ms))
	c.settle()
	if got := c.flood("a"); got != 3 {
		t.Fatalf("three live members: admitted %d of 9, want 3", got)
	}
	c.net.Partition([]string{"n2"})
	ms["n0"].update(MemberEvent{Kind: MemberDead, Member: Member{ID: "n2"}})
	if got := c.flood("b"); got < 4 {
		t.Fatalf("n2 declared dead: admitted %d of 9 on a fresh key, want half of it at once", got)
	}
	if got := c.nodes[0].Peers(); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Fatalf("a dead member must stay a peer: %v", got)
	}
	c.net.Heal()
	c.runTo(c.clk.Now().Add(2 * time.Second))
	c.settle()
	if got := c.flood("c"); got < 4 {
		t.Fatalf("n2 heard again but still dead to the membership: admitted %d of 9, want half", got)
	}
	ms["n0"].update(MemberEvent{Kind: MemberJoin, Member: Member{ID: "n2"}})
	if got := c.flood("d"); got != 3 {
		t.Fatalf("n2 alive again: admitted %d of 9, want 3", got)
	}
}

// Set on a static list joins and leaves members at run time, without a
// restart: a member added is charged and charges, one removed is not.
func TestStaticMembershipSet(t *testing.T) {
	ms := map[string]*StaticMembership{}
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1, withMembership(ms))
	// A node that lists n0 and n1; they do not list it yet.
	node, lim := newNode(t, Config{Transport: c.net.Endpoint("n2"), Secret: secret, Peers: c.addrs},
		throttle.NewRate(1, time.Minute), 10, throttle.WithClock(c.clk))
	c.nodes = append(c.nodes, node)
	// Its peers do not answer it: having heard none, it stays gated (see
	// Node.gateStart), a key's admissions within rate x the time since
	// its start.
	c.runTo(c.clk.Now().Add(startSilence * time.Second))
	if d, _ := lim.Allow(ctx, "k", 1); d.Allowed {
		t.Fatalf("a node that heard none of its peers admitted a fresh key's burst")
	}
	c.runTo(c.clk.Now().Add(time.Minute))
	if d, _ := lim.Allow(ctx, "k", 1); !d.Allowed {
		t.Fatalf("gated a minute after its start, a key at 1/minute denied")
	}
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[0].Tokens("k"); tok != 10 {
		t.Fatalf("n0 charged a non-member: %d tokens", tok)
	}
	ms["n0"].Set("n1", "n2")
	ms["n1"].Set("n0", "n2")
	c.runTo(c.clk.Now().Add(3 * time.Second))
	lim.Allow(ctx, "k", 1)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[0].Tokens("k"); tok != 9 {
		t.Fatalf("after the list's reload, n0 holds %d tokens of k, want 9 (n2's later hit charged)", tok)
	}
	var kinds []MemberEventKind
	stop := ms["n0"].Subscribe(func(e MemberEvent) { kinds = append(kinds, e.Kind) })
	defer stop()
	ms["n0"].Set("n1")
	if got := c.nodes[0].Peers(); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("after removing n2: peers %v", got)
	}
	if !slices.Equal(kinds, []MemberEventKind{MemberLeave}) {
		t.Fatalf("removing n2 emitted %v, want one MemberLeave", kinds)
	}
}

// A peer's incarnation from the membership is a floor: datagrams of an
// older life are refused even before the new life speaks.
func TestMemberIncarnationFloor(t *testing.T) {
	ms := map[string]*StaticMembership{}
	c := newCluster(t, 2, throttle.NewRate(1, time.Minute), 10, time.Second, false, 1, withMembership(ms))
	inc := c.nodes[1].incarnation.Load()
	ms["n0"].update(MemberEvent{Kind: MemberJoin, Member: Member{ID: "n1", Incarnation: inc + 1}})
	c.lims[1].Allow(ctx, "k", 3)
	st := c.nodes[0].Stats()
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[0].Tokens("k"); tok != 10 {
		t.Fatalf("n0 took reports of an incarnation below the membership's: %d tokens", tok)
	}
	if got := c.nodes[0].Stats().Stale - st.Stale; got == 0 {
		t.Fatal("no datagram counted stale")
	}
}

// Membership.Local sets the node's ID and incarnation.
func TestMembershipLocal(t *testing.T) {
	net := newNetwork(nil, 1)
	m := NewStaticMembership(Member{ID: "me:1", Incarnation: 42}, "me:1", "p:1")
	n, err := NewNode(Config{Transport: net.Endpoint("x"), Secret: secret, Membership: m})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.ID() != "me:1" || n.incarnation.Load() != 42 || !slices.Equal(n.Peers(), []string{"p:1"}) {
		t.Fatalf("ID %q, incarnation %d, peers %v", n.ID(), n.incarnation.Load(), n.Peers())
	}
	if _, err := NewNode(Config{Transport: net.Endpoint("y"), Secret: secret, Membership: m, Peers: []string{"q:1"}}); err == nil {
		t.Fatal("Peers and a Membership accepted")
	}
	if _, err := NewNode(Config{Transport: net.Endpoint("z"), Secret: secret, Membership: m, ID: "other:1"}); err == nil {
		t.Fatal("a Config.ID that differs from the membership's accepted")
	}
}

// moving is a membership whose Local incarnation a test moves.
type moving struct {
	*StaticMembership
	inc atomic.Uint64
}

func (m *moving) Local() Member { return Member{Incarnation: m.inc.Load()} }

// A node follows its membership's incarnation when it moves (the
// membership found an older life above this one), and its peers go on
// charging its counters once: no hit is charged twice or lost.
func TestNodeFollowsLocalIncarnation(t *testing.T) {
	var mv *moving
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 10, time.Second, false, 1, func(cfg *Config) {
		if cfg.Transport.Addr() == "n1" {
			mv = &moving{StaticMembership: NewStaticMembership(Member{}, cfg.Peers...)}
			mv.inc.Store(uint64(time.Now().UnixNano()))
			cfg.Membership, cfg.Peers = mv, nil
		}
	})
	c.lims[1].Allow(ctx, "k", 3)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[0].Tokens("k"); tok != 7 {
		t.Fatalf("before the move n0 holds %d tokens, want 7", tok)
	}
	moved := mv.inc.Add(1000)
	c.runTo(c.clk.Now().Add(2 * time.Second))
	if got := c.nodes[1].incarnation.Load(); got != moved {
		t.Fatalf("n1's incarnation %d, the membership's %d", got, moved)
	}
	c.lims[1].Allow(ctx, "k", 1)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if tok := c.lims[0].Tokens("k"); tok != 6 {
		t.Fatalf("after the move and one more hit n0 holds %d tokens, want 6", tok)
	}
}
