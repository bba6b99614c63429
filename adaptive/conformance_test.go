package adaptive

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestConformance runs the module's suite on a Limiter and a Keyed whose
// limit holds still (the fixed Algorithm) at Config.Max, releasing with a
// success. (Below Max, a request above the current limit is denied, not
// refused with ErrExceedsLimit: the limit may grow.)
func TestConformance(t *testing.T) {
	for _, limit := range []int{1, 3, 64} {
		t.Run(fmt.Sprint("Limiter", limit), func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
					return mustNew(t, &fixed{}, Config{Initial: limit, Max: limit}, clk)
				},
				Limit: limit,
				Bound: func(time.Duration) int64 { return int64(limit) },
				Release: func(l throttle.Limiter, _ string, n int) {
					if err := l.(*Limiter).Release(n, time.Millisecond, Success); err != nil {
						panic(err)
					}
				},
				Single: true,
			})
		})
		t.Run(fmt.Sprint("Keyed", limit), func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
					k, err := NewKeyed(func() Algorithm { return &fixed{} }, Config{Initial: limit, Max: limit}, throttle.WithClock(clk))
					if err != nil {
						t.Fatal(err)
					}
					return k
				},
				Limit: limit,
				Bound: func(time.Duration) int64 { return int64(limit) },
				Release: func(l throttle.Limiter, key string, n int) {
					if err := l.(*Keyed).Release(key, n, time.Millisecond, Success); err != nil {
						panic(err)
					}
				},
			})
		})
	}
}
