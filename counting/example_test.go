package counting_test

import (
	"context"
	"fmt"

	"github.com/throttlekit/throttle/counting"
)

// At most 2 requests in flight per user: a third is refused until one
// finishes.
func Example() {
	l, err := counting.New(2)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 3 {
		d, _ := l.Allow(ctx, "alice", 1)
		fmt.Println("allowed:", d.Allowed, "remaining:", d.Remaining)
	}
	_ = l.Release("alice", 1) // one request done
	d, _ := l.Allow(ctx, "alice", 1)
	fmt.Println("allowed:", d.Allowed)
	// Output:
	// allowed: true remaining: 1
	// allowed: true remaining: 0
	// allowed: false remaining: 0
	// allowed: true
}

// Acquire waits its turn; the release function is safe to defer and to
// call early.
func ExampleSemaphore_Acquire() {
	sem, err := counting.NewSemaphore(10)
	if err != nil {
		panic(err)
	}
	release, err := sem.Acquire(context.Background(), 4)
	if err != nil {
		panic(err)
	}
	defer release()
	fmt.Println("in flight:", sem.InFlight())
	release()
	fmt.Println("in flight:", sem.InFlight())
	// Output:
	// in flight: 4
	// in flight: 0
}
