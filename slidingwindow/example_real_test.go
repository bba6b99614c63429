package slidingwindow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle/slidingwindow"
)

// 2 requests per key in any hour, without the burst a fixed window lets
// through at its edge.
func Example() {
	l, err := slidingwindow.New(2, time.Hour)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Println(d.Allowed, d.Remaining)
	}
	// Output:
	// true 1
	// true 0
	// false 0
}
