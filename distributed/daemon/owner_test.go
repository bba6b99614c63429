package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/throttletest"
)

// With routing "owner", two daemons share one exact bucket per tag, and
// the pipelined lines of one read are forwarded together: a few
// datagrams for the lot, not one (and one round trip) per line.
func TestOwnerRouting(t *testing.T) {
	clk := throttletest.NewClock()
	var srv []*daemon.Server
	for range 2 {
		cfg := config("tcp:127.0.0.1:0")
		cfg.Default = daemon.Limit{Rate: "1/m", Burst: 2}
		cfg.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: secret, Routing: daemon.RoutingOwner,
			ForwardTimeout: daemon.Duration(5 * time.Second)}
		srv = append(srv, start(t, cfg, throttle.WithClock(clk)))
	}
	for i, s := range srv {
		if err := s.Node().Join(srv[1-i].Node().ID()); err != nil {
			t.Fatal(err)
		}
	}
	// A round on each, so that each knows the other's incarnation.
	for range 2 {
		clk.Advance(time.Second)
		before := srv[0].Stats().Gossip.PacketsReceived + srv[1].Stats().Gossip.PacketsReceived
		for _, s := range srv {
			s.Node().Tick()
		}
		eventually(t, func() bool {
			return srv[0].Stats().Gossip.PacketsReceived+srv[1].Stats().Gossip.PacketsReceived >= before+2
		})
	}
	var lines, want []string
	for i := range 40 {
		tag := fmt.Sprintf("tag-%d", i)
		lines = append(lines, tag, tag, tag)
		want = append(want, daemon.ReplyOK, daemon.ReplyOK, daemon.ReplyNO)
	}
	sent := srv[0].Stats().Gossip.PacketsSent
	got := ask(t, dial(t, srv[0].Addrs()[0]), len(lines), lines...)
	if got != strings.Join(want, "") {
		t.Fatalf("replies %q, want %q", got, strings.Join(want, ""))
	}
	// The 120 lines reach the server in one or a few reads; about half
	// of their tags are the other daemon's.
	if n := srv[0].Stats().Gossip.PacketsSent - sent; n > 4 {
		t.Errorf("%d datagrams forwarded 120 pipelined lines", n)
	}
	// Every tag's bucket is empty, whichever daemon asks.
	c1 := dial(t, srv[1].Addrs()[0])
	for i := range 40 {
		if r := ask(t, c1, 1, fmt.Sprintf("tag-%d", i)); r != daemon.ReplyNO {
			t.Fatalf("tag-%d on the other daemon: %q", i, r)
		}
	}
	// The metrics count owner routing's events and partition charges.
	var m strings.Builder
	if err := srv[0].WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`throttled_gossip_owned_total{event="forwarded"}`, `throttled_gossip_owned_units_total{kind="charged"} 0`} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, m.String())
		}
	}
}

func TestRoutingConfig(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	if got := cfg.WithDefaults().Gossip.Routing; got != daemon.RoutingAll {
		t.Errorf("default routing %q", got)
	}
	cfg.Gossip.Routing = "nearest"
	if err := cfg.Validate(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("routing %q: %v", cfg.Gossip.Routing, err)
	}
	cfg.Gossip.Routing, cfg.Gossip.ForwardTimeout = daemon.RoutingOwner, -1
	if err := cfg.Validate(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("negative forward timeout: %v", err)
	}
	cfg.Gossip.ForwardTimeout, cfg.Gossip.ForwardDelay = 0, -1
	if err := cfg.Validate(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("negative forward delay: %v", err)
	}
	s := start(t, config("tcp:127.0.0.1:0"))
	cfg = config("tcp:127.0.0.1:0")
	cfg.Gossip.Routing = daemon.RoutingOwner
	if err := s.Reload(cfg); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("reload changing the routing: %v", err)
	}
}

// ownerPair starts two owner-routed daemons that know each other, with
// the limit lim, the forward timeout fwd (0: the default) and the other
// gossip and forward settings at their defaults, and returns them with a
// tag daemon 1 owns.
func ownerPair(t *testing.T, fwd time.Duration, lim daemon.Limit, rules ...daemon.Rule) (srv []*daemon.Server, tag string) {
	t.Helper()
	for range 2 {
		cfg := config("tcp:127.0.0.1:0")
		cfg.Default, cfg.Rules = lim, rules
		cfg.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: secret, Routing: daemon.RoutingOwner, ForwardTimeout: daemon.Duration(fwd)}
		srv = append(srv, start(t, cfg))
	}
	for i, s := range srv {
		if err := s.Node().Join(srv[1-i].Node().ID()); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // a round on each, so that each knows the other's incarnation
		before := srv[0].Stats().Gossip.PacketsReceived + srv[1].Stats().Gossip.PacketsReceived
		for _, s := range srv {
			s.Node().Tick()
		}
		eventually(t, func() bool {
			return srv[0].Stats().Gossip.PacketsReceived+srv[1].Stats().Gossip.PacketsReceived >= before+2
		})
	}
	return srv, forwardedTag(srv[0], "paused-")
}

// forwardedTag returns the first tag prefix+i that s forwards to its
// owner.
func forwardedTag(s *daemon.Server, prefix string) string {
	for i := 0; ; i++ {
		tag := fmt.Sprintf("%s%d", prefix, i)
		fwd := s.Stats().Owned.Forwarded
		s.Decide(tag) // spends a token of the owner's bucket, not s's fallback
		if s.Stats().Owned.Forwarded > fwd {
			return tag
		}
	}
}

// An owner that stops answering (paused 3 s) must not turn into
// fail-open for a client at its defaults: the daemon asked decides on its
// fallback bucket (burst 6 / 2 daemons = 3) before the client's timeout,
// so what the client is told "admitted" stays within the fallback bound,
// and every call returns within the client's timeout. (With the client's
// 25 ms timeout below the daemon's 50 ms forward timeout, nearly every
// query timed out and was admitted.)
func TestPausedOwnerClientDefaults(t *testing.T) {
	srv, tag := ownerPair(t, 0, daemon.Limit{Rate: "1/m", Burst: 6})
	timeout := client.DefaultTimeout
	if race {
		timeout *= 5 // the detector slows the daemon, not the owner's silence
	}
	c, err := client.New("tcp", srv[0].Addrs()[0].String(), client.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv[1].Node().Close() // paused: it neither answers nor gossips (4 silent intervals would move its tags)
	admitted, calls, failed := 0, 0, 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); calls++ {
		t0 := time.Now()
		ok, err := c.Check(context.Background(), tag)
		if d := time.Since(t0); err != nil || d > timeout {
			if failed++; failed == 1 {
				t.Errorf("call %d: %v after %v (client timeout %v)", calls, err, d, timeout)
			}
		}
		if ok {
			admitted++
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The fallback bucket: burst 3, and 1/m / 2 refills nothing in 3 s.
	if admitted > 3 {
		t.Errorf("%d of %d queries admitted while the owner was paused; the fallback bound is 3", admitted, calls)
	}
	if failed > 0 {
		t.Errorf("%d of %d calls failed or outlasted the client's timeout", failed, calls)
	}
	t.Logf("%d of %d admitted; %+v", admitted, calls, c.Stats())
}

// The lines of one read that match different limits, whose owner does
// not answer, wait for one forward timeout together, not one per limit
// (they waited 2 x 50 ms with two limits at the default timeout). A long
// timeout keeps the test clear of a loaded machine's scheduling delays.
func TestUnreachableOwnerDelaysAReadOnce(t *testing.T) {
	lim := daemon.Limit{Rate: "1/m", Burst: 6}
	const fwd = 300 * time.Millisecond
	srv, a := ownerPair(t, fwd, lim, daemon.Rule{Pattern: "b-*", Limit: daemon.Limit{Rate: "1/m", Burst: 8}})
	b := forwardedTag(srv[0], "b-")
	srv[1].Node().Close()
	c := dial(t, srv[0].Addrs()[0])
	ask(t, c, 2, a, b) // the first forwarded asks may leave late (forward delay)
	t0 := time.Now()
	if got := ask(t, c, 2, a, b); got != daemon.ReplyOK+daemon.ReplyOK {
		t.Errorf("replies %q, want two fallback admissions", got)
	}
	if d, most := time.Since(t0), fwd*3/2; d > most {
		t.Errorf("a read of two limits' tags, their owner paused, answered after %v; want one forward timeout (< %v)", d, most)
	}
}
