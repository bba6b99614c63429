package daemon_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
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
