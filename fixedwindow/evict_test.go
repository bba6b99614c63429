package fixedwindow

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestEvictedKeyNotFresh: a key evicted by the MaxKeys cap while its
// window is full must not come back with an empty window, aligned or
// anchored; and nobody is held once the window has passed.
func TestEvictedKeyNotFresh(t *testing.T) {
	for _, anchored := range []bool{false, true} {
		throttletest.Eviction(t, time.Hour, func(clk *throttletest.Clock, limit, maxKeys int) (throttle.Limiter, error) {
			return newLimiter(limit, time.Hour, anchored, []throttle.Option{throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys)})
		})
	}
}

// FuzzNoBypass: with a cap of 4 keys on 16, the limiter never admits what
// an unbounded one holding the same admissions would deny, aligned (form
// 0) or anchored (1).
func FuzzNoBypass(f *testing.F) {
	throttletest.FuzzNoBypass(f, 2, 4*time.Millisecond, func(form, limit int, opts ...throttle.Option) (throttle.Limiter, error) {
		return newLimiter(limit, 256*time.Millisecond, form == 1, opts)
	})
}
