package fixedwindow_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/throttletest"
)

// TestAlgorithm: the pure step, kept in a store of one's own, passes the
// conformance suite and decides as the Limiter on a random trace, aligned
// and anchored.
func TestAlgorithm(t *testing.T) {
	limit, w := 7, 1500*time.Millisecond
	for _, anchored := range []bool{false, true} {
		a, err := fixedwindow.NewAlgorithm(limit, w, anchored)
		if err != nil {
			t.Fatal(err)
		}
		throttletest.Run(t, throttletest.Suite{
			New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
				return throttletest.Store(clk, 0, a.Decide)
			},
			Limit: limit,
			Bound: func(d time.Duration) int64 { return int64(limit) * (int64((d+w-1)/w) + 1) },
		})
		clk := throttletest.NewClock()
		mk := fixedwindow.New
		if anchored {
			mk = fixedwindow.NewAnchored
		}
		l, err := mk(limit, w, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		throttletest.Differential(t, clk, l, throttletest.Store(clk, 0, a.Decide), limit, 3000)
		l.Close()
	}
	if _, _, err := (fixedwindow.Algorithm{}).Decide(0, 0, 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("zero Algorithm: %v", err)
	}
}
