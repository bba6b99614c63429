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
// an unbounded one holding the same admissions would deny.
func FuzzNoBypass(f *testing.F) {
	f.Add(uint8(0), false, []byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 10, 0, 0, 11, 0, 0, 0, 0, 0}) // evicts k0, then asks again
	f.Add(uint8(1), true, []byte{0, 0, 10, 1, 0, 10, 2, 0, 10, 3, 0, 10, 4, 0, 10, 0, 0, 10})
	f.Fuzz(func(t *testing.T, limit uint8, anchored bool, steps []byte) {
		lim := 1 + int(limit%20)
		clk := throttletest.NewClock()
		l, err := newLimiter(lim, 256*time.Millisecond, anchored, []throttle.Option{throttle.WithClock(clk), throttle.WithMaxKeys(4)})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := newLimiter(lim, 256*time.Millisecond, anchored, []throttle.Option{throttle.WithClock(clk)})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		defer ref.Close()
		throttletest.NoBypass(t, l, ref, clk, lim, 4*time.Millisecond, steps)
	})
}
