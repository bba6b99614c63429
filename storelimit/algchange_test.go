package storelimit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// An algorithm changed over the same keys (a limiter of another
// Algorithm on the same store): what the registry's store-clocks row
// states. The new algorithm reads a state the old one wrote either as its
// own (the token and leaky buckets share theirs: the usage carries), or
// as a fresh key (at most one more limit: a window's count is forgotten),
// or refuses it with an error wrapping throttle.ErrInvalid (a window
// reading a bucket's state); never more than one limit more.
func TestAlgorithmChangeOverSameKeys(t *testing.T) {
	const limit = 10
	tb, _ := tokenbucket.NewAlgorithm(throttle.PerSecond(limit), limit)
	lb, _ := leakybucket.NewAlgorithm(throttle.PerSecond(limit), limit)
	fw, _ := fixedwindow.NewAlgorithm(limit, time.Second, false)
	sw, _ := slidingwindow.NewAlgorithm(limit, time.Second)
	algs := []storelimit.Algorithm{tb, lb, fw, sw}
	for _, from := range algs {
		for _, to := range algs {
			t.Run(fmt.Sprintf("%T/%T", from, to), func(t *testing.T) {
				clk, m := throttletest.NewClock(), new(storelimit.Memory)
				spend := func(a storelimit.Algorithm) (admitted, invalid int) {
					l, err := storelimit.New(m, a, throttle.WithClock(clk))
					if err != nil {
						t.Fatal(err)
					}
					for range 2 * limit {
						d, err := l.Allow(context.Background(), "k", 1)
						switch {
						case errors.Is(err, throttle.ErrInvalid):
							invalid++
						case err != nil:
							t.Fatal(err)
						case d.Allowed:
							admitted++
						}
					}
					return admitted, invalid
				}
				if n, _ := spend(from); n != limit {
					t.Fatalf("the first algorithm admitted %d, want %d", n, limit)
				}
				n, invalid := spend(to)
				if n > limit || (invalid > 0 && (n > 0 || invalid != 2*limit)) {
					t.Errorf("after the change: %d admitted, %d refused as invalid; want at most %d, or every call refused", n, invalid, limit)
				}
				t.Logf("after the change: %d admitted, %d refused as invalid", n, invalid)
			})
		}
	}
}
