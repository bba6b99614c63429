package leakybucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
)

// A queue of jobs draining at 30 a minute that overflows at 2: what does
// not fit is rejected with the time until it would.
func Example() {
	l, err := leakybucket.New(throttle.NewRate(30, time.Minute), 2)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "jobs", 1)
		fmt.Println(d.Allowed, d.RetryAfter.Round(time.Second))
	}
	// Output:
	// true 0s
	// true 0s
	// false 2s
}
