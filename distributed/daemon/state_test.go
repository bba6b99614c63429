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
	cfg, clk, stop := stateFixture(t)
	run := func() *daemon.Server { return started(t, cfg, throttle.WithClock(clk)) }
	s := run()
	spendAliceAndBob(s)
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
// (an NTP correction during a deploy) restores its state file less what
// the step takes away, as it would from a running daemon's bucket: a tag
// that spent its burst is still refused.
// Before, a state saved "in the future" was ignored and every tag started
// on a full bucket (the fault simulator's seeds 835690510922581563 and
// 6076404530534874524: 31 admitted where one bucket allows 28).
func TestRestartClockSteppedBack(t *testing.T) {
	cfg, clk, stop := stateFixture(t)
	s := started(t, cfg, throttle.WithClock(clk))
	spendAliceAndBob(s)
	stop(s)
	clk.Advance(-2 * time.Second)
	s = started(t, cfg, throttle.WithClock(clk))
	defer stop(s)
	if got := s.Decide("alice"); got != daemon.ReplyNO {
		t.Errorf("alice after a restart on a clock stepped back 2 s: %q, want NO (her burst was spent)", got)
	}
	// The running daemon's bucket would hold 4 − 2/60 tokens: 3 whole.
	if tok := s.Tokens("bob"); tok != 3 {
		t.Errorf("bob after a restart on a clock stepped back 2 s: %d tokens, want 3", tok)
	}
}

// A standalone daemon restarted with a changed limit, or stopped before
// a tag's first query after a reload changed its limit, carries the
// tag's usage as a reload does: the new bucket holds at most its burst
// less what the old one had used. Before, such tags started full: one
// burst more per restart (the fault simulator's seed
// 1817538317673345591: 73 admitted where one bucket allows 71.5).
func TestRestartChangedLimitKeepsUsage(t *testing.T) {
	cfg, clk, stop := stateFixture(t)
	s := started(t, cfg, throttle.WithClock(clk))
	spendAliceAndBob(s)
	stop(s)
	cfg.Default.Burst = 10 // changed while the daemon was down
	s = started(t, cfg, throttle.WithClock(clk))
	if a, b := s.Tokens("alice"), s.Tokens("bob"); a != 5 || b != 9 {
		t.Errorf("restarted with burst 10: alice %d, bob %d tokens; want 5 and 9 (10 less what each used)", a, b)
	}
	cfg.Default.Burst = 8
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	stop(s) // alice has not been asked since the reload
	s = started(t, cfg, throttle.WithClock(clk))
	defer stop(s)
	if a := s.Tokens("alice"); a != 3 {
		t.Errorf("stopped right after a reload to burst 8, restarted: alice %d tokens, want 3 (8 less the 5 used)", a)
	}
}

// A standalone daemon restarted while a reload still carries usage keeps
// the replaced limits' buckets: a reload back to one of them after the
// restart finds its usage. Before, the restarted daemon had only the
// running limit's buckets, and a raise back to a limit in use before the
// restart granted the difference of bursts again (the fault simulator's
// seed 2186906901992982708: 109 admitted where one bucket allows 108.5).
func TestRestartKeepsReplacedLimits(t *testing.T) {
	cfg, clk, stop := stateFixture(t)
	s := started(t, cfg, throttle.WithClock(clk))
	reload := func(burst int) {
		cfg.Default.Burst = burst
		if err := s.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	spendAliceAndBob(s) // alice: 0 of 5
	reload(10)
	for range 5 {
		s.Decide("alice") // 0 of 10: all 10 used
	}
	reload(5)
	stop(s)
	s = started(t, cfg, throttle.WithClock(clk))
	defer stop(s)
	reload(10)
	admitted := 0
	for range 10 {
		if s.Decide("alice") == daemon.ReplyOK {
			admitted++
		}
	}
	if admitted != 0 {
		t.Errorf("burst 5, 10, 5, a restart, 10 again: alice admitted %d times, want 0 (her bucket of 10 was spent)", admitted)
	}
}

// stateFixture returns a standalone daemon's configuration (1/m, burst
// 5) with a state file, its clock, and a Shutdown that must succeed.
func stateFixture(t *testing.T) (daemon.Config, *throttletest.Clock, func(*daemon.Server)) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 5}
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	stop := func(s *daemon.Server) {
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return cfg, throttletest.NewClock(), stop
}

// spendAliceAndBob spends alice's burst of 5 and one of bob's tokens.
func spendAliceAndBob(s *daemon.Server) {
	for range 5 {
		s.Decide("alice")
	}
	s.Decide("bob")
}
