package fixedwindow_test

import (
	"context"
	"fmt"

	"time"

	"github.com/throttlekit/throttle/fixedwindow"
)

// 2 requests per key per hour, counted in windows aligned to the clock.
func Example() {
	l, err := fixedwindow.New(2, time.Hour)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter > 0)
	}
	// Output:
	// true 1 false
	// true 0 false
	// false 0 true
}
