package throttletest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Run is called from a test of your own limiter's package,
//
//	func TestConformance(t *testing.T) { throttletest.Run(t, suite) }
//
// with a Suite that builds the limiter on the virtual clock it is given
// and states the most it may admit. Here, the suite of a token bucket of
// burst 5 refilled at 10 per second, as this module's own tests run it.
func ExampleRun() {
	rate, burst := throttle.PerSecond(10), 5
	suite := throttletest.Suite{
		New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
			l, err := tokenbucket.New(rate, burst, throttle.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		},
		Limit: burst,
		Bound: func(d time.Duration) int64 { return int64(burst) + rate.Events(d) },
	}
	fmt.Println("a fresh key admits", suite.Limit, "at once, at most", suite.Bound(time.Second), "in any second")
	// Output: a fresh key admits 5 at once, at most 15 in any second
}
