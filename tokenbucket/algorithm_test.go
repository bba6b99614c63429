package tokenbucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestAlgorithm: the pure step, kept in a store of one's own, passes the
// conformance suite and decides as the Limiter on a random trace.
func TestAlgorithm(t *testing.T) {
	rate, burst := throttle.PerSecond(10), 5
	a, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	throttletest.Run(t, throttletest.Suite{
		New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
			return throttletest.Store(clk, tokenbucket.Full, a.Decide)
		},
		Limit: burst,
		Bound: func(d time.Duration) int64 { return int64(burst) + rate.Events(d) },
	})
	clk := throttletest.NewClock()
	l, err := tokenbucket.New(rate, burst, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	throttletest.Differential(t, clk, l, throttletest.Store(clk, tokenbucket.Full, a.Decide), burst, 3000)
	if _, _, err := (tokenbucket.Algorithm{}).Decide(tokenbucket.Full, 0, 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("zero Algorithm: %v", err)
	}
}
