package slidingwindow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
)

// 2 requests per key in any hour, without the burst a fixed window lets
// through at its edge: 2 requests in the last second of one hour leave
// none for the start of the next, where the previous hour still weighs
// in full; half of it has passed 30 minutes later.
func Example() {
	clk := throttletest.NewClock() // virtual time from midnight, for a reproducible output
	l, err := slidingwindow.New(2, time.Hour, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	clk.Advance(time.Hour - time.Second)
	d, _ := l.Allow(context.Background(), "alice", 2)
	fmt.Println("00:59:59 two:", d.Allowed)
	clk.Advance(time.Second)
	d, _ = l.Allow(context.Background(), "alice", 1)
	fmt.Println("01:00:00 one more:", d.Allowed, "retry after", d.RetryAfter)
	clk.Advance(d.RetryAfter)
	d, _ = l.Allow(context.Background(), "alice", 1)
	fmt.Println("then:", d.Allowed)
	// Output:
	// 00:59:59 two: true
	// 01:00:00 one more: false retry after 30m0s
	// then: true
}
