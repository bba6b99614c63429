package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A keyed limiter per client: 2 requests per second with bursts of 3.
// Denial is a value; the Decision says when to come back.
func ExampleLimiter() {
	clk := throttletest.NewClock() // virtual time, so the output is fixed
	l, err := tokenbucket.New(throttle.PerSecond(2), 3, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := range 4 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Printf("request %d: allowed=%v remaining=%d retry-after=%v\n", i+1, d.Allowed, d.Remaining, d.RetryAfter)
	}
	d, _ := l.Allow(ctx, "bob", 1)
	fmt.Println("bob is limited separately:", d.Allowed)
	// Output:
	// request 1: allowed=true remaining=2 retry-after=0s
	// request 2: allowed=true remaining=1 retry-after=0s
	// request 3: allowed=true remaining=0 retry-after=0s
	// request 4: allowed=false remaining=0 retry-after=500ms
	// bob is limited separately: true
}

// An API token allows one call every 6 seconds. Wrap
// turns the call into a throttled one that fails fast with ErrLimited.
func ExampleWrap() {
	clk := throttletest.NewClock()
	l, _ := tokenbucket.New(throttle.NewRate(1, 6*time.Second), 1, throttle.WithClock(clk))
	call := throttle.Wrap(l, "api-token", func(context.Context) (string, error) { return "called", nil })

	for _, at := range []time.Duration{2 * time.Second, 7 * time.Second, 5 * time.Second, 2 * time.Second} {
		clk.Advance(at)
		out, err := call(context.Background())
		var limited *throttle.LimitedError
		if errors.As(err, &limited) {
			fmt.Println("limited, retry after", limited.Decision.RetryAfter)
			continue
		}
		fmt.Println(out)
	}
	// Output:
	// called
	// called
	// limited, retry after 1s
	// called
}

// Wait books the next free slot on limiters that can reserve (FIFO, one
// wake-up per slot) and honours the context's deadline.
func ExampleWait() {
	l, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fmt.Println(throttle.Wait(ctx, l, "report", 1)) // the first slot is free
	err := throttle.Wait(ctx, l, "report", 1)       // the next is an hour away
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output:
	// <nil>
	// true
}
