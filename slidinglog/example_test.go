package slidinglog_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/throttletest"
)

// At most 3 requests in any second, exactly: the fourth waits for the
// first to leave the window, to the nanosecond.
func Example() {
	clk := throttletest.NewClock() // virtual time, for a reproducible output
	l, err := slidinglog.New(3, time.Second, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Println("allowed:", d.Allowed, "remaining:", d.Remaining)
		clk.Advance(100 * time.Millisecond)
	}
	d, _ := l.Allow(ctx, "alice", 1)
	fmt.Println("allowed:", d.Allowed, "retry after:", d.RetryAfter)
	clk.Advance(d.RetryAfter)
	d, _ = l.Allow(ctx, "alice", 1)
	fmt.Println("allowed:", d.Allowed)
	// Output:
	// allowed: true remaining: 2
	// allowed: true remaining: 1
	// allowed: true remaining: 0
	// allowed: false retry after: 700ms
	// allowed: true
}
