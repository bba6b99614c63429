package redislimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestCluster runs every algorithm on a 3-master Redis Cluster with keys
// spread over the slots: each script touches one slot, and each key
// admits exactly its limit with time frozen.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test skipped in -short mode")
	}
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	clk := throttletest.NewClock()
	const limit = 3
	mk := map[string]func() (throttle.Limiter, error){
		"tokenbucket": func() (throttle.Limiter, error) {
			return NewTokenBucket(c, throttle.PerHour(1), limit, vclock(clk))
		},
		"fixedwindow": func() (throttle.Limiter, error) {
			return NewFixedWindow(c, limit, time.Hour, vclock(clk))
		},
		"slidingwindow": func() (throttle.Limiter, error) {
			return NewSlidingWindow(c, limit, time.Hour, vclock(clk))
		},
		"slidinglog": func() (throttle.Limiter, error) {
			return NewSlidingLog(c, limit, time.Hour, vclock(clk))
		},
		"concurrency": func() (throttle.Limiter, error) {
			return NewConcurrency(c, limit, time.Hour, vclock(clk))
		},
	}
	for name, f := range mk {
		l, err := f()
		if err != nil {
			t.Fatal(err)
		}
		// Keys with braces too: "}abc" once gave the log's two keys an empty
		// hash tag, so they hashed to different slots (CROSSSLOT).
		for k := range 36 {
			key := fmt.Sprintf("%s-user-%d", name, k)
			if k >= 30 {
				key = []string{"}abc", "{x}y", "}{", "a{}b", "{", "}"}[k-30] + name
			}
			admitted := 0
			for range limit + 2 {
				d, err := l.Allow(ctx, key, 1)
				if err != nil {
					t.Fatalf("%s %s: %v", name, key, err)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != limit {
				t.Fatalf("%s %s: admitted %d, want %d", name, key, admitted, limit)
			}
		}
	}
	if l, _ := mk["tokenbucket"](); l != nil {
		res, err := l.(*Bucket).Reserve(ctx, "reserve-key", 1, 0)
		if err != nil || !res.OK {
			t.Fatalf("Reserve on the cluster: %+v, %v", res, err)
		}
	}
	// The keys are spread over every master.
	for _, a := range cl.Addrs {
		n, err := redistest.Do(a, time.Second, "DBSIZE")
		if err != nil || n == "0" {
			t.Fatalf("master %s holds %s keys (%v): keys not spread", a, n, err)
		}
	}
}

// TestSentinel runs the conformance suite through a Sentinel-aware
// client: the limiter finds the master by asking a Sentinel, as users of
// redis.NewFailoverClient do.
func TestSentinel(t *testing.T) {
	master := redistest.Start(t)
	master.NeedOwn(t)
	sentinel := redistest.StartSentinel(t, master, "throttle")
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            "throttle",
		SentinelAddrs:         []string{sentinel.Addr},
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the Sentinel: %v", err)
	}
	throttletest.Run(t, bucketSuite(c))
	// The state lives on the master the Sentinel names.
	if n, err := redistest.Do(master.Addr, time.Second, "DBSIZE"); err != nil || n == "0" {
		t.Fatalf("master DBSIZE = %q, %v; want the limiter's keys there", n, err)
	}
}
