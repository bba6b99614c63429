package leakybucket_test

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

// A meter of capacity 4 draining 2 units per second: what does not fit
// overflows.
func ExampleNewBucket() {
	clk := throttletest.NewClock()
	b, err := leakybucket.NewBucket(throttle.PerSecond(2), 4, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	for _, n := range []int{3, 2, 1} {
		d, _ := b.AllowN(n)
		fmt.Printf("pour %d: allowed=%-5v level=%d retry after %v\n", n, d.Allowed, b.Level(), d.RetryAfter)
	}
	clk.Advance(time.Second)
	d, _ := b.AllowN(2)
	fmt.Printf("1s later, pour 2: allowed=%v level=%d\n", d.Allowed, b.Level())
	// Output:
	// pour 3: allowed=true  level=3 retry after 0s
	// pour 2: allowed=false level=3 retry after 500ms
	// pour 1: allowed=true  level=4 retry after 0s
	// 1s later, pour 2: allowed=true level=4
}

// A pacer of 10 per second with a slack of 1 and a queue bounded to 250
// ms: after an idle spell two callers pass at once, the next ones are
// spaced 100 ms apart, and a caller whose slot is too far is turned away.
func ExampleNewPacer() {
	clk := throttletest.NewClock()
	p, err := leakybucket.NewPacer(throttle.PerSecond(10), 1, 250*time.Millisecond, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	for range 6 {
		wait, err := p.Reserve()
		fmt.Println(wait, err)
	}
	// Output:
	// 0s <nil>
	// 0s <nil>
	// 100ms <nil>
	// 200ms <nil>
	// 50ms throttle: rate limited: pacer queue full: the next slot is more than 250ms away
	// 50ms throttle: rate limited: pacer queue full: the next slot is more than 250ms away
}
