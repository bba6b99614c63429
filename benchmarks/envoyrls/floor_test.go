package envoyrls

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle/internal/envoyreftest"
	"github.com/throttlekit/throttle/internal/redistest"
)

// incrScript is one INCRBY in a script, as a decision's script run on
// one key.
var incrScript = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// TestRoundTrips measures, one call at a time as a single stream makes
// them, the two round trips a decision on Redis cannot do without: a gRPC
// call of the load generator to this service answering from memory, and
// a script run on Redis from the servers' CPUs (one INCRBY); beside them,
// a whole request of one descriptor to this service and to the reference
// on Redis. At one stream a request takes at least the sum of the first
// two: the most a server on Redis can gain over the reference there is
// the reference's request time over that sum. Run it as
// TestVersusReference (the same variables and flags).
func TestRoundTrips(t *testing.T) {
	if os.Getenv(envBench) != "1" {
		t.Skip("a measurement of about half a minute: set " + envBench + "=1 to run it")
	}
	pinSelf(t, *serverCPUs)
	srv := redistest.Start(t)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/bench.yaml", []byte(benchConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, _ := envoyreftest.StartProc(t, envoyreftest.Binary(t), benchConfig, srv.Addr)
	ref := dial(t, addr)
	ours, mem := one(t, os.Args[0], dir, "redis", srv.Addr), one(t, os.Args[0], dir, "memory", "")
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rc.Close() })
	ctx := context.Background()
	kinds := []struct {
		name string
		cpus *string
		call func() error
	}{
		{"Redis script (1 INCRBY), from the servers' CPUs", serverCPUs, func() error {
			return incrScript.Run(ctx, rc, []string{"floor"}, 1).Err()
		}},
		{"gRPC call, answered from memory", genCPUs, func() error { return callOnce(mem.c) }},
		{"throttled on Redis, 1 descriptor", genCPUs, func() error { return callOnce(ours.c) }},
		{"envoyproxy/ratelimit on Redis, 1 descriptor", genCPUs, func() error { return callOnce(ref) }},
	}
	times := make([][]time.Duration, len(kinds))
	for range *rounds { // the kinds alternate, as the subjects of TestVersusReference
		for i, k := range kinds {
			pinSelf(t, *k.cpus)
			timeEach(t, cellTime/10, k.call)
			times[i] = append(times[i], timeEach(t, cellTime, k.call)...)
		}
	}
	var b strings.Builder
	b.WriteString("| round trip, one at a time | mean | p50 | p99 |\n|---|---|---|---|\n")
	for i, k := range kinds {
		ts := times[i]
		slices.Sort(ts)
		var sum time.Duration
		for _, d := range ts {
			sum += d
		}
		fmt.Fprintf(&b, "| %s | %v | %v | %v |\n", k.name, (sum / time.Duration(len(ts))).Round(time.Microsecond),
			ts[len(ts)/2].Round(time.Microsecond), ts[len(ts)*99/100].Round(time.Microsecond))
	}
	t.Log("round trips:\n" + b.String())
}

// callOnce asks c about one descriptor on the hot key.
func callOnce(c rlsv3.RateLimitServiceClient) error {
	_, err := c.ShouldRateLimit(context.Background(), request(1, "hot"))
	return err
}

// timeEach calls f one call after the other for d, and returns how long
// each took.
func timeEach(t *testing.T, d time.Duration, f func() error) []time.Duration {
	var ts []time.Duration
	for stop := time.Now().Add(d); time.Now().Before(stop); {
		start := time.Now()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		ts = append(ts, time.Since(start))
	}
	return ts
}
