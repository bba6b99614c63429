package tokenbucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Per-client limits on the real clock: 60 requests a minute, bursts of 3.
func Example() {
	l, err := tokenbucket.New(throttle.NewRate(60, time.Minute), 3)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 4 {
		d, err := l.Allow(ctx, "203.0.113.9", 1)
		if err != nil {
			panic(err) // bad input, never a denial
		}
		fmt.Printf("allowed=%v remaining=%d retry after %v\n", d.Allowed, d.Remaining, d.RetryAfter.Round(time.Second))
	}
	// Output:
	// allowed=true remaining=2 retry after 0s
	// allowed=true remaining=1 retry after 0s
	// allowed=true remaining=0 retry after 0s
	// allowed=false remaining=0 retry after 1s
}
