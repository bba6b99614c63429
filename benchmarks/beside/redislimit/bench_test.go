package redislimit_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/redislimit"
	"github.com/throttlekit/throttle/internal/redistest"
)

// benchGoroutines are the concurrency levels of the comparison.
var benchGoroutines = []int{1, 8, 64}

// runLatency calls op b.N times from g goroutines and reports ops/s and
// the p50 and p99 latency of one call.
func runLatency(b *testing.B, g int, op func(ctx context.Context, i int) error) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	lat := make([][]time.Duration, g)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			mine := make([]time.Duration, 0, b.N/g+1)
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					break
				}
				t0 := time.Now()
				if err := op(ctx, i); err != nil {
					failed.Store(err)
					break
				}
				mine = append(mine, time.Since(t0))
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "ops/s")
}

func benchClient(b *testing.B) *redis.Client {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 128})
	b.Cleanup(func() { c.Close() })
	return c
}

var benchKeys = func() []string {
	k := make([]string, 256)
	for i := range k {
		k[i] = fmt.Sprintf("user:%d", i)
	}
	return k
}()

// BenchmarkPerDecision compares one decision per round trip: this
// package's token bucket, go-redis/redis_rate (AllowN, also GCRA), and the
// floor, a bare EVALSHA returning 1, all on the same client.
func BenchmarkPerDecision(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	tb, err := redislimit.NewTokenBucket(c, throttle.PerSecond(1_000_000), 1_000_000, redislimit.WithPrefix(uniquePrefix()), redislimit.WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	rr := redis_rate.NewLimiter(c)
	rrLimit := redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}
	floor := redis.NewScript("return 1")
	if err := floor.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	for _, g := range benchGoroutines {
		b.Run(fmt.Sprintf("redislimit/g=%d", g), func(b *testing.B) {
			defer serverCost(b, c)()
			runLatency(b, g, func(ctx context.Context, i int) error {
				_, err := tb.Allow(ctx, benchKeys[i&255], 1)
				return err
			})
		})
		b.Run(fmt.Sprintf("redis_rate/g=%d", g), func(b *testing.B) {
			defer serverCost(b, c)()
			runLatency(b, g, func(ctx context.Context, i int) error {
				_, err := rr.AllowN(ctx, benchKeys[i&255], rrLimit, 1)
				return err
			})
		})
		b.Run(fmt.Sprintf("evalsha/g=%d", g), func(b *testing.B) {
			defer serverCost(b, c)()
			keys := []string{"floor"}
			runLatency(b, g, func(ctx context.Context, i int) error {
				return floor.EvalSha(ctx, c, keys).Err()
			})
		})
	}
}

// BenchmarkAlgorithms measures one decision of each algorithm at 8
// goroutines.
func BenchmarkAlgorithms(b *testing.B) {
	c := benchClient(b)
	mk := map[string]func() (throttle.Limiter, error){
		"tokenbucket": func() (throttle.Limiter, error) {
			return redislimit.NewTokenBucket(c, throttle.PerSecond(1_000_000), 1_000_000, redislimit.WithPrefix(uniquePrefix()))
		},
		"fixedwindow": func() (throttle.Limiter, error) {
			return redislimit.NewFixedWindow(c, 1_000_000, time.Second, redislimit.WithPrefix(uniquePrefix()))
		},
		"slidingwindow": func() (throttle.Limiter, error) {
			return redislimit.NewSlidingWindow(c, 1_000_000, time.Second, redislimit.WithPrefix(uniquePrefix()))
		},
		"slidinglog": func() (throttle.Limiter, error) {
			return redislimit.NewSlidingLog(c, 1_000, time.Second, redislimit.WithPrefix(uniquePrefix()))
		},
		"concurrency": func() (throttle.Limiter, error) {
			return redislimit.NewConcurrency(c, 1_000_000, time.Second, redislimit.WithPrefix(uniquePrefix()))
		},
	}
	for _, name := range []string{"tokenbucket", "fixedwindow", "slidingwindow", "slidinglog", "concurrency"} {
		l, err := mk[name]()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			runLatency(b, 8, func(ctx context.Context, i int) error {
				_, err := l.Allow(ctx, benchKeys[i&255], 1)
				return err
			})
		})
	}
}

// serverCost resets the server's command statistics and returns a
// function that reports the server time spent per EVALSHA.
func serverCost(b *testing.B, c *redis.Client) func() {
	ctx := context.Background()
	c.ConfigResetStat(ctx)
	return func() {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return
		}
		for _, line := range strings.Split(info, "\n") {
			if !strings.HasPrefix(line, "cmdstat_evalsha:") {
				continue
			}
			for _, f := range strings.Split(strings.TrimSpace(line[len("cmdstat_evalsha:"):]), ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					var x float64
					fmt.Sscan(v, &x)
					b.ReportMetric(x*1000, "server-ns/op")
				}
			}
		}
	}
}

// BenchmarkLeasing is the token-leasing mode at 64 goroutines, beside
// redis_rate at the same concurrency: decisions per second, and the units
// admitted over the bucket's bound (burst + rate·elapsed), which must stay
// at most 1.01.
func BenchmarkLeasing(b *testing.B) {
	c := benchClient(b)
	rate, burst := throttle.PerSecond(100_000), 1000
	for _, maxBatch := range []int{64, 512} {
		b.Run(fmt.Sprintf("redislimit-lease%d/g=64", maxBatch), func(b *testing.B) {
			l, err := redislimit.NewTokenBucket(c, rate, burst, redislimit.WithPrefix(uniquePrefix()), redislimit.WithTimeout(time.Second),
				redislimit.WithLeasing(maxBatch, 100*time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			var admitted atomic.Int64
			start := time.Now()
			runLatency(b, 64, func(ctx context.Context, i int) error {
				d, err := l.Allow(ctx, "api", 1)
				if d.Allowed {
					admitted.Add(1)
				}
				return err
			})
			el := time.Since(start)
			b.ReportMetric(float64(admitted.Load())/float64(int64(burst)+rate.Events(el)), "admitted/limit")
		})
	}
	rr := redis_rate.NewLimiter(c)
	rrLimit := redis_rate.Limit{Rate: 100_000, Burst: 1000, Period: time.Second}
	key := uniquePrefix()
	b.Run("redis_rate/g=64", func(b *testing.B) {
		runLatency(b, 64, func(ctx context.Context, i int) error {
			_, err := rr.AllowN(ctx, key, rrLimit, 1)
			return err
		})
	})
}

// BenchmarkRatio64 interleaves short rounds of this package's token
// bucket, redis_rate and the bare EVALSHA at 64 goroutines, so that the
// noise of a shared machine hits all three alike, and reports the ratios
// of their throughputs (one op = one round of 500 decisions of each),
// and the client and server CPU time per decision.
func BenchmarkRatio64(b *testing.B) {
	c := benchClient(b)
	tb, err := redislimit.NewTokenBucket(c, throttle.PerSecond(1_000_000), 1_000_000, redislimit.WithPrefix(uniquePrefix()), redislimit.WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	rr := redis_rate.NewLimiter(c)
	rrLimit := redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}
	floor := redis.NewScript("return 1")
	ops := []func(ctx context.Context, i int) error{
		func(ctx context.Context, i int) error { _, err := tb.Allow(ctx, benchKeys[i&255], 1); return err },
		func(ctx context.Context, i int) error {
			_, err := rr.AllowN(ctx, benchKeys[i&255], rrLimit, 1)
			return err
		},
		func(ctx context.Context, i int) error { return floor.Run(ctx, c, []string{"floor"}).Err() },
	}
	const round, g = 500, 64
	var spent, cpu, server [3]time.Duration
	for i := 0; i < b.N; i++ {
		for v, op := range ops {
			cpu0, srv0 := cpuTime(), serverTime(c)
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range g {
				wg.Go(func() {
					for next.Add(1) <= round {
						if err := op(context.Background(), int(next.Load())); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			spent[v] += time.Since(start)
			cpu[v] += cpuTime() - cpu0
			server[v] += serverTime(c) - srv0
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*round) }
	b.ReportMetric(per(cpu[0]), "redislimit-client-ns/op")
	b.ReportMetric(per(cpu[1]), "redis_rate-client-ns/op")
	b.ReportMetric(per(server[0]), "redislimit-server-ns/op")
	b.ReportMetric(per(server[1]), "redis_rate-server-ns/op")
	b.ReportMetric(spent[1].Seconds()/spent[0].Seconds(), "redislimit/redis_rate")
	b.ReportMetric(spent[2].Seconds()/spent[0].Seconds(), "redislimit/evalsha")
	b.ReportMetric(float64(b.N*round)/spent[0].Seconds(), "redislimit-ops/s")
	b.ReportMetric(float64(b.N*round)/spent[1].Seconds(), "redis_rate-ops/s")
}

// cpuTime is the CPU time (user and system) of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverTime is the CPU time the server has spent, from INFO cpu.
func serverTime(c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				var x float64
				fmt.Sscan(v, &x)
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

var prefixSeq atomic.Int64

func uniquePrefix() string {
	return fmt.Sprintf("bench:%d:%d:", time.Now().UnixNano(), prefixSeq.Add(1))
}
