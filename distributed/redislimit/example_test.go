package redislimit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/redislimit"
	"github.com/throttlekit/throttle/throttletest"
)

// exampleAddr is the server started by the package's TestMain.
func exampleAddr() string { return os.Getenv("REDISLIMIT_EXAMPLE_ADDR") }

// Workers on many machines share an API token that allows one call every
// six seconds. Each worker books the next free permit and waits for it.
func ExampleNewTokenBucket_every() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	clk := throttletest.NewClock() // virtual time, to print exact delays
	l, err := redislimit.NewTokenBucket(rdb, throttle.Every(6*time.Second), 1,
		redislimit.WithPrefix(fmt.Sprintf("example:%d:", time.Now().UnixNano())),
		redislimit.WithOptions(throttle.WithClock(clk)))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	for worker := range 3 {
		// At most 2 permits may be booked ahead: maxWait = 2 × 6s.
		r, err := l.Reserve(ctx, "partner-api", 1, 12*time.Second)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("worker %d: ok=%v wait %v\n", worker, r.OK, r.Delay)
	}
	r, _ := l.Reserve(ctx, "partner-api", 1, 12*time.Second)
	fmt.Printf("worker 3: ok=%v, back off for %v\n", r.OK, r.Delay)
	// Output:
	// worker 0: ok=true wait 0s
	// worker 1: ok=true wait 6s
	// worker 2: ok=true wait 12s
	// worker 3: ok=false, back off for 6s
}

// A quota that must survive a failover: each decision is answered once
// one replica has it. The example's server has no replica, so the
// decision fails, and failsafe.Closed refuses it.
func ExampleWithReplicas() {
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	l, err := redislimit.NewTokenBucket(rdb, throttle.PerHour(10), 10,
		redislimit.WithPrefix(fmt.Sprintf("example:%d:", time.Now().UnixNano())),
		redislimit.WithTimeout(time.Second),
		redislimit.WithReplicas(1, 50*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := l.Allow(context.Background(), "alice", 1)
	fmt.Println(d.Allowed, errors.Is(err, throttle.ErrUnavailable))
	// Output:
	// false true
}
