package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/throttletest"
)

// A limit of concurrent calls to a backend that Vegas adapts: each call
// reports its round-trip time when it releases, and the limit grows while
// the RTT stays at its no-load value.
func Example() {
	clk := throttletest.NewClock()
	l, err := adaptive.New(&adaptive.Vegas{}, adaptive.Config{Initial: 10}, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 200 { // 200 windows of 10 calls at 5 ms, the backend never queuing
		for range 10 {
			l.Allow(ctx, "", 1)
		}
		clk.Advance(100 * time.Millisecond)
		for range 10 {
			l.Release(1, 5*time.Millisecond, adaptive.Success)
		}
	}
	fmt.Println("limit grew:", l.Limit() > 10)
	// Output:
	// limit grew: true
}

// TryHold's release measures the RTT itself, so a Limiter drops into
// throttle.Wrap (as into httplimit and grpclimit) unchanged; a call past
// its deadline counts as a drop.
func ExampleLimiter_TryHold() {
	l, err := adaptive.New(&adaptive.AIMD{}, adaptive.Config{Initial: 4})
	if err != nil {
		panic(err)
	}
	call := throttle.Wrap(l, "db", func(ctx context.Context) (string, error) {
		return "row", nil
	})
	row, err := call(context.Background())
	fmt.Println(row, err, l.InFlight())
	// Output:
	// row <nil> 0
}

func ExampleAIMD() {
	a := &adaptive.AIMD{Backoff: 0.5}
	fmt.Println(a.Update(20, adaptive.Window{Samples: 40, MaxInFlight: 20}))
	fmt.Println(a.Update(20, adaptive.Window{Samples: 39, Dropped: 1, MaxInFlight: 20}))
	// Output:
	// 22
	// 10
}

func ExampleVegas() {
	v := &adaptive.Vegas{}
	w := adaptive.Window{Samples: 100, AvgRTT: 10 * time.Millisecond, MinRTT: 10 * time.Millisecond, MaxInFlight: 100}
	for range 9 { // the first 1000 successes measure the RTT without a queue: no change
		v.Update(100, w)
	}
	// No queue (RTT at its least): grow by 6·log10(limit).
	fmt.Printf("%.1f\n", v.Update(100, w))
	// RTT doubled: the average RTT rises by half, a third of the requests
	// are queued: shrink by log10(limit).
	w.AvgRTT = 20 * time.Millisecond
	fmt.Printf("%.1f\n", v.Update(100, w))
	// Output:
	// 112.0
	// 98.0
}

func ExampleGradient2() {
	g := &adaptive.Gradient2{Smoothing: 1}
	w := adaptive.Window{Samples: 100, AvgRTT: 10 * time.Millisecond, MaxInFlight: 100}
	fmt.Println(g.Update(100, w)) // gradient 1 (within tolerance): limit + QueueSize
	w.AvgRTT = 60 * time.Millisecond
	fmt.Printf("%.0f\n", g.Update(100, w)) // short RTT well above the long one: shrink
	// Output:
	// 104
	// 92
}

// Gradient2 measures the RTT without a queue after its first 10 windows,
// then every Probe windows: it holds the limit at QueueSize until the
// queue drained, lets one more window pass, takes the next window's mean
// RTT as the long-term RTT and gives the limit back.
func ExampleGradient2_probe() {
	g := &adaptive.Gradient2{Probe: 100}
	limit := 40.0
	for i := 1; i <= 15; i++ {
		in := int(limit)
		limit = g.Update(limit, adaptive.Window{Samples: 100, AvgRTT: 10 * time.Millisecond, MaxInFlight: in})
		if i >= 10 {
			fmt.Printf("window %d: limit %.1f\n", i, limit)
		}
	}
	// Output:
	// window 10: limit 48.0
	// window 11: limit 4.0
	// window 12: limit 4.0
	// window 13: limit 4.0
	// window 14: limit 48.0
	// window 15: limit 48.8
}

// A client of a backend that refuses most requests: once it has been
// refused enough, the Throttler drops requests locally, so the backend
// sees about K = 2 requests for each one it accepts.
func ExampleThrottler() {
	t, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{K: 2})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := range 1000 { // 1000 requests, 100 of them accepted
		t.Allow(ctx, "", 1)
		if i%10 == 0 {
			t.Accept(1)
		}
	}
	fmt.Printf("drop probability %.1f\n", t.DropProbability())
	// (1000 − 2·100) / 1001
	// Output:
	// drop probability 0.8
}

// Throttled wraps a call; errors that mean overload (throttle.ErrLimited,
// throttle.ErrUnavailable, a deadline) are not accepts.
func ExampleThrottled() {
	t, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{})
	if err != nil {
		panic(err)
	}
	get := adaptive.Throttled(t, "inventory", func(ctx context.Context) (int, error) {
		return 0, fmt.Errorf("inventory busy: %w", throttle.ErrUnavailable)
	})
	limited := 0
	for range 100 {
		if _, err := get(context.Background()); errors.Is(err, throttle.ErrLimited) {
			limited++
		}
	}
	fmt.Println("dropped locally:", limited > 50)
	// Output:
	// dropped locally: true
}

// A limit per downstream host, each found by its own Gradient2.
func ExampleKeyed() {
	k, err := adaptive.NewKeyed(func() adaptive.Algorithm { return &adaptive.Gradient2{} }, adaptive.Config{Initial: 8})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	d, release, _ := k.TryHold(ctx, "db-1.internal", 1)
	defer release()
	fmt.Println(d.Allowed, d.Limit)
	// Output: true 8
}
