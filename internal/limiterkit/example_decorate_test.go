package limiterkit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A wrapper made with Decorate keeps what the wrapped limiter can do: here
// a concurrency limit stays a Holder, so TryHold holds units through the
// wrapper and release gives them back.
func ExampleDecorate() {
	sem, _ := counting.NewSemaphore(1)
	logged := limiterkit.Decorate(sem, func(ctx context.Context, c limiterkit.Call, next limiterkit.Next) (limiterkit.Result, error) {
		r, err := next(ctx, c)
		fmt.Println(c.Method, c.Key, r.Decision.Allowed)
		return r, err
	}, nil)
	_, release, _ := throttle.TryHold(context.Background(), logged, "db", 1)
	_, _, _ = throttle.TryHold(context.Background(), logged, "db", 1) // full
	release()
	fmt.Println("in flight:", sem.InFlight())
	// Output:
	// TryHold db true
	// TryHold db false
	// in flight: 0
}

// A wrapper on the path of every decision gives Decorate a direct Allow
// beside its Decorator; the other methods (here Reserve, kept
// because the bucket is a Reserver) go through the Decorator.
func ExampleDecorate_allow() {
	tb, _ := tokenbucket.New(throttle.PerSecond(1), 2)
	defer tb.Close()
	calls := 0 // not safe for concurrent use: an example
	counted := limiterkit.Decorate(tb,
		func(ctx context.Context, c limiterkit.Call, next limiterkit.Next) (limiterkit.Result, error) {
			calls++
			return next(ctx, c)
		},
		func(ctx context.Context, key string, n int) (throttle.Decision, error) {
			calls++
			return tb.Allow(ctx, key, n)
		})
	ctx := context.Background()
	counted.Allow(ctx, "k", 1)
	res, _ := counted.(throttle.Reserver).Reserve(ctx, "k", 1, time.Second)
	fmt.Println(calls, res.OK)
	// Output: 2 true
}

// A Reserver of one's own returns what it booked with NewReservation;
// Cancel gives it back once, whichever copy calls it.
func ExampleNewReservation() {
	booked := 1
	r := limiterkit.NewReservation(2*time.Second, 10, func() { booked-- })
	c := r
	c.Cancel()
	r.Cancel()
	fmt.Println(r.OK, r.Delay, booked)
	// Output: true 2s 0
}
