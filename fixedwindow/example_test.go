package fixedwindow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/throttletest"
)

// 2 requests per key per hour. Windows aligned to the clock (New) start
// afresh for every key on the hour: a client that spent its 2 in the last
// second of one has 2 more a second later. Anchored windows (NewAnchored)
// start at a key's first request, so that client waits an hour.
func Example() {
	clk := throttletest.NewClock() // virtual time from midnight, for a reproducible output
	aligned, err := fixedwindow.New(2, time.Hour, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer aligned.Close()
	anchored, err := fixedwindow.NewAnchored(2, time.Hour, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer anchored.Close()
	ctx := context.Background()
	for _, at := range []time.Duration{time.Hour - time.Second, time.Hour - time.Second, time.Hour, time.Hour} {
		clk.Set(throttletest.Epoch.Add(at))
		a, _ := aligned.Allow(ctx, "alice", 1)
		b, _ := anchored.Allow(ctx, "alice", 1)
		fmt.Printf("%s aligned %-5v anchored %v\n", clk.Now().Format("15:04:05"), a.Allowed, b.Allowed)
	}
	// Output:
	// 00:59:59 aligned true  anchored true
	// 00:59:59 aligned true  anchored true
	// 01:00:00 aligned true  anchored false
	// 01:00:00 aligned true  anchored false
}
