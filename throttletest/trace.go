package throttletest

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// Step is one request of a virtual-time trace: move the clock forward by
// Advance, then ask for N units.
type Step struct {
	Advance time.Duration
	N       int
}

// Replay plays trace on l for key, moving clk before each step, and
// returns the decisions in order. An error from l fails t.
func Replay(t testing.TB, l throttle.Limiter, clk *Clock, key string, trace []Step) []throttle.Decision {
	t.Helper()
	out := make([]throttle.Decision, len(trace))
	for i, s := range trace {
		clk.Advance(s.Advance)
		d, err := l.Allow(context.Background(), key, s.N)
		if err != nil {
			t.Fatalf("step %d (%+v): %v", i, s, err)
		}
		out[i] = d
	}
	return out
}
