package daemon_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/throttletest"
)

// A standalone daemon restarted (SIGTERM, then a start) keeps its tags'
// usage through its state file: a tag that spent its burst is still
// refused, refilled for the time the daemon was down; a state older than
// daemon.MaxStateAge is ignored. Before, every restart gave every tag a
// fresh burst.
func TestRestartKeepsUsage(t *testing.T) {
	clk := throttletest.NewClock()
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 5}
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	run := func() *daemon.Server { return started(t, cfg, throttle.WithClock(clk)) }
	stop := func(s *daemon.Server) {
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s := run()
	for range 5 {
		s.Decide("alice")
	}
	s.Decide("bob")
	stop(s)
	clk.Advance(30 * time.Second) // down for 30 s: alice regains nothing yet (1/m)
	s = run()
	if got := s.Decide("alice"); got != daemon.ReplyNO {
		t.Errorf("alice after a restart 30 s later: %q, want NO (her burst was spent)", got)
	}
	if tok := s.Tokens("bob"); tok != 4 {
		t.Errorf("bob after the restart: %d tokens, want 4", tok)
	}
	stop(s)
	clk.Advance(daemon.MaxStateAge + time.Second)
	s = run()
	defer stop(s)
	if tok := s.Tokens("alice"); tok != 5 {
		t.Errorf("alice after a restart past MaxStateAge: %d tokens, want a full bucket of 5", tok)
	}
	cfg.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: secret}
	if err := cfg.Validate(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("state_file with gossip: %v, want ErrInvalid", err)
	}
}

// A standalone daemon whose host clock is stepped back while it is down
// (an NTP correction during a deploy) restores its state file as saved,
// with nothing refilled: a tag that spent its burst is still refused.
// Before, a state saved "in the future" was ignored and every tag started
// on a full bucket (the fault simulator's seeds 835690510922581563 and
// 6076404530534874524: 31 admitted where one bucket allows 28).
func TestRestartClockSteppedBack(t *testing.T) {
	clk := throttletest.NewClock()
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 5}
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	s := started(t, cfg, throttle.WithClock(clk))
	for range 5 {
		s.Decide("alice")
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(-2 * time.Second)
	s = started(t, cfg, throttle.WithClock(clk))
	defer s.Shutdown(context.Background())
	if got := s.Decide("alice"); got != daemon.ReplyNO {
		t.Errorf("alice after a restart on a clock stepped back 2 s: %q, want NO (her burst was spent)", got)
	}
}
