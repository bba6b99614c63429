package gossipmember

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/gossipnet"
)

// fast is a memberlist configuration for loopback tests: a dead node is
// suspected within a probe (100 ms) and declared dead about
// SuspicionMult x log10(N+1) x ProbeInterval later.
func fast() *memberlist.Config {
	c := memberlist.DefaultLocalConfig()
	c.ProbeInterval, c.ProbeTimeout = 100*time.Millisecond, 80*time.Millisecond
	c.GossipInterval, c.SuspicionMult = 10*time.Millisecond, 3
	c.PushPullInterval, c.TCPTimeout = time.Second, time.Second
	return c
}

// recorder records the events of a membership.
type recorder struct {
	mu     sync.Mutex
	events []gossip.MemberEvent
}

func (r *recorder) add(e gossip.MemberEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// wait waits up to d for an event of kind about id, and returns how long
// it took.
func (r *recorder) wait(t *testing.T, kind gossip.MemberEventKind, id string, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		r.mu.Lock()
		ok := slices.ContainsFunc(r.events, func(e gossip.MemberEvent) bool { return e.Kind == kind && e.Member.ID == id })
		r.mu.Unlock()
		if ok {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no event %d about %s within %v; got %+v", kind, id, d, r.events)
	return 0
}

func start(t *testing.T, name string, seeds []string, tweak ...func(*Config)) *Membership {
	t.Helper()
	cfg := Config{Name: name, Bind: "127.0.0.1:0", GossipAddr: "gossip-" + name, Seeds: seeds, Memberlist: fast(), Rejoin: 100 * time.Millisecond}
	for _, f := range tweak {
		f(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func addr(m *Membership) string { return m.self }

func ids(ms []gossip.Member) []string {
	var s []string
	for _, m := range ms {
		s = append(s, m.ID)
	}
	slices.Sort(s)
	return s
}

// Members join through a seed; one killed is reported dead within the
// suspicion time, one that leaves at once, and both are forgotten after
// ForgetDead.
func TestJoinDeadLeave(t *testing.T) {
	a := start(t, "a", nil, func(c *Config) { c.ForgetDead = time.Second })
	var rec recorder
	a.Subscribe(rec.add)
	b := start(t, "b", []string{addr(a)})
	c := start(t, "c", []string{addr(a)})
	rec.wait(t, gossip.MemberJoin, "gossip-b", 2*time.Second)
	rec.wait(t, gossip.MemberJoin, "gossip-c", 2*time.Second)
	if got := ids(a.Members()); !slices.Equal(got, []string{"gossip-b", "gossip-c"}) {
		t.Fatalf("members %v", got)
	}
	if l := a.Local(); l.ID != "gossip-a" || l.Incarnation == 0 {
		t.Fatalf("local %+v", l)
	}
	c.shutdown(false) // killed: no leave message
	took := rec.wait(t, gossip.MemberDead, "gossip-c", 5*time.Second)
	t.Logf("killed member reported dead after %v", took)
	if slices.Contains(ids(a.Members()), "gossip-c") {
		t.Fatal("a dead member listed")
	}
	b.Close()
	// Its leave message reports it at once; if that is lost (Leave gives
	// up after a second), the failure detector does, as for c, in a time
	// that grows with memberlist's awareness of a slow host.
	rec.wait(t, gossip.MemberDead, "gossip-b", 5*time.Second)
	rec.wait(t, gossip.MemberLeave, "gossip-c", 2*time.Second)
	rec.wait(t, gossip.MemberLeave, "gossip-b", 2*time.Second)
}

// A node found by discovery (an injected resolver: what a DNS query
// would return) joins without restarting the others; the rejoin loop
// finds it later too. On memberlist's in-memory network.
func TestDiscoverJoins(t *testing.T) {
	mnet := &memberlist.MockNetwork{}
	onMock := func(c *Config) {
		c.Memberlist = fast()
		c.Memberlist.Transport = mnet.NewTransport(c.Name)
	}
	a := start(t, "a", nil, onMock)
	var mu sync.Mutex
	var found []string
	discover := func(context.Context) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return found, nil
	}
	var rec recorder
	b := start(t, "b", nil, onMock, func(c *Config) { c.Discover = discover })
	b.Subscribe(rec.add)
	mu.Lock()
	found = []string{addr(a)} // the name now resolves to a
	mu.Unlock()
	rec.wait(t, gossip.MemberJoin, "gossip-a", 3*time.Second)
	if err := b.Join(context.Background()); err != nil {
		t.Fatalf("joining known members again: %v", err)
	}
}

// A node restarted with its clock set back still starts a later life
// than the one the cluster remembers.
func TestIncarnationMovesPastOlderLife(t *testing.T) {
	a := start(t, "a", nil)
	var rec recorder
	a.Subscribe(rec.add)
	b1 := start(t, "b", []string{addr(a)})
	old := b1.Local().Incarnation
	rec.wait(t, gossip.MemberJoin, "gossip-b", 2*time.Second)
	b1.shutdown(false) // killed; a still gossips its entry
	back := time.Unix(0, int64(old)).Add(-time.Hour)
	b2 := start(t, "b", []string{addr(a)}, func(c *Config) { c.Bind, c.Now = addr(b1), func() time.Time { return back } })
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range a.Members() {
			if m.ID == "gossip-b" && m.Incarnation > old && b2.Local().Incarnation == m.Incarnation {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("restarted with the clock an hour back: incarnation %d, the old life's %d; a sees %+v", b2.Local().Incarnation, old, a.Members())
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{}, {Bind: "127.0.0.1:0"}, {Bind: "nonsense", GossipAddr: "x"}, {Bind: "127.0.0.1:70000", GossipAddr: "x"}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

func Example() {
	ring, _ := memberlist.NewKeyring(nil, []byte("0123456789abcdef")) // from a key file
	m, err := New(Config{Bind: "127.0.0.1:0", GossipAddr: "127.0.0.1:7946", Keyring: ring})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	fmt.Println(m.Local().ID, len(m.Members()))
	// Output: 127.0.0.1:7946 0
}

func TestLogLevels(t *testing.T) {
	var b strings.Builder
	w := logWriter{slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	log.New(w, "", 0).Printf("[WARN] memberlist: Refuting a suspect message")
	log.New(w, "", 0).Printf("[DEBUG] memberlist: Stream connection")
	if got := b.String(); !strings.Contains(got, `level=WARN msg="memberlist: Refuting`) || !strings.Contains(got, `level=DEBUG msg="[DEBUG] memberlist`) {
		t.Fatalf("log %q", got)
	}
}

// wall is the system clock, for the gossip network.
type wall struct{}

func (wall) Now() time.Time { return time.Now() }

// dropTo loses every gossip datagram a transport sends to one address: a
// loss in one direction that memberlist, on its own sockets, does not see.
type dropTo struct {
	gossip.Transport
	to string
}

func (d dropTo) Send(addr string, p []byte) error {
	if addr == d.to {
		return nil
	}
	return d.Transport.Send(addr, p)
}

// While memberlist reports every member alive, a loss of the gossip
// datagrams in one direction (a to b) does not give a key two owners:
// ownership follows the membership only. Before, b took a for dead after
// its silence rule (4 intervals) and owned a's keys too.
func TestOneWayLossKeepsOneOwner(t *testing.T) {
	a := start(t, "a", nil)
	b := start(t, "b", []string{addr(a)})
	c := start(t, "c", []string{addr(a)})
	net := gossipnet.New(wall{}, 1, 0)
	var lims []*gossip.OwnedLimiter
	for _, m := range []*Membership{a, b, c} {
		var tr gossip.Transport = net.Endpoint(m.Local().ID)
		if m == a {
			tr = dropTo{tr, b.Local().ID}
		}
		n, err := gossip.NewNode(gossip.Config{Transport: tr, Secret: []byte("0123456789abcdef0123"), Membership: m,
			Interval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		n.Start()
		l, err := n.NewOwnedLimiter("api", throttle.PerSecond(10), 5)
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			net.Deliver()
			time.Sleep(time.Millisecond)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(a.Members()) < 2 || len(b.Members()) < 2 || len(c.Members()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the members did not all join")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // 20 intervals: b has not heard a's gossip for all of them
	split := 0
	for i := range 300 {
		k := fmt.Sprintf("key-%d", i)
		if o := lims[0].Owner(k); lims[1].Owner(k) != o || lims[2].Owner(k) != o {
			split++
		}
	}
	if got := ids(b.Members()); len(got) != 2 {
		t.Skipf("memberlist itself no longer reports every member alive: %v", got)
	}
	if split > 0 {
		t.Errorf("%d of 300 keys have two owners while memberlist reports every member alive", split)
	}
}

// Join fails with ErrJoin when no seed it had to join answers.
func TestJoinNoSeedAnswers(t *testing.T) {
	var armed atomic.Bool
	m := start(t, "a", nil, func(c *Config) {
		c.Discover = func(context.Context) ([]string, error) {
			if armed.Load() {
				return []string{"127.0.0.1:1"}, nil // nothing listens there
			}
			return nil, nil
		}
	})
	armed.Store(true)
	if err := m.Join(context.Background()); !errors.Is(err, ErrJoin) {
		t.Fatalf("Join with a seed that does not answer: %v, want ErrJoin", err)
	}
}
