package tokenbucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// At most once every 6 seconds: requests at t = 2, 9, 14 and 16 s.
func ExampleNewBucket() {
	clk := throttletest.NewClock()
	b, err := tokenbucket.NewBucket(throttle.NewRate(1, 6*time.Second), 1, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	last := 0
	for _, t := range []int{2, 9, 14, 16} {
		clk.Advance(time.Duration(t-last) * time.Second)
		last = t
		d, _ := b.AllowN(1)
		fmt.Printf("t=%2ds allowed=%-5v retry after %v\n", t, d.Allowed, d.RetryAfter)
	}
	// Output:
	// t= 2s allowed=true  retry after 0s
	// t= 9s allowed=true  retry after 0s
	// t=14s allowed=false retry after 1s
	// t=16s allowed=true  retry after 0s
}

// A keyed limiter: each API key gets 10 requests per second with bursts
// of 5. A peer reports 8 requests of "alice" it admitted: debited here,
// alice's bucket goes below empty.
func ExampleNew() {
	clk := throttletest.NewClock()
	l, err := tokenbucket.New(throttle.PerSecond(10), 5, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()

	d, _ := l.Allow(ctx, "alice", 2)
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	l.Debit("alice", 8)
	fmt.Println(l.Tokens("alice"), l.Tokens("bob"))
	d, _ = l.Allow(ctx, "alice", 1)
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 3 200ms
	// -5 5
	// false 600ms
}

// A store of one's own keeps each key's state (here a map; a SQL row or a
// Memcached item in practice, written with a compare-and-swap) and
// decides with the pure step.
func ExampleAlgorithm() {
	a, _ := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 2)
	states := map[string]int64{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range 3 {
		state, ok := states["k"]
		if !ok {
			state = a.Fresh() // a new key
		}
		next, d, err := a.Decide(state, now, 1)
		if err != nil {
			panic(err)
		}
		states["k"] = next // compare-and-swap against state in a real store
		fmt.Println(i, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// 0 true 1 0s
	// 1 true 0 0s
	// 2 false 0 1s
}
