package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

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
