package pglimit_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/distributed/redislimit"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// BenchmarkBackends measures decisions per second of one token bucket
// (burst 100, 1000/s) per key kept in PostgreSQL (storelimit over this
// package's Store), in Redis (redislimit's script) and in memory
// (storelimit.Memory, the cost of the loop itself), in one run: 16
// goroutines over 16 connections, on 1000 keys (mostly admissions: two
// round trips on PostgreSQL, one on Redis) and on one hot key (mostly
// denials after the first burst: one round trip each). For PostgreSQL it
// also reports the statements sent per decision (round-trips/op).
func BenchmarkBackends(b *testing.B) {
	rate, burst := throttle.PerSecond(1000), 100
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		b.Fatal(err)
	}
	clk := throttletest.NewClock()
	var pg *trips
	backends := []struct {
		name string
		new  func(b *testing.B) throttle.Limiter
	}{
		{"postgres", func(b *testing.B) throttle.Limiter {
			// A generous timeout: the benchmark measures throughput, not faults.
			pg = &trips{Store: newStore(b, newPool(b, srv, 16), pglimit.WithTimeout(30*time.Second))}
			return storetest.NewLimiter(b, pg, alg, clk)
		}},
		{"redis", func(b *testing.B) throttle.Limiter {
			c := redis.NewClient(&redis.Options{Addr: redistest.Start(b).Addr, PoolSize: 16})
			b.Cleanup(func() { c.Close() })
			l, err := redislimit.NewTokenBucket(c, rate, burst, redislimit.WithOptions(throttle.WithClock(clk)))
			if err != nil {
				b.Fatal(err)
			}
			return l
		}},
		{"memory", func(b *testing.B) throttle.Limiter {
			return storetest.NewLimiter(b, new(storelimit.Memory), alg, clk)
		}},
	}
	for _, keys := range []int{1000, 1} {
		for _, be := range backends {
			b.Run(be.name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				l := be.new(b)
				var seq atomic.Int64
				b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // about 16 goroutines
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						key := "k" + strconv.Itoa(int(seq.Add(1))%keys)
						if _, err := l.Allow(context.Background(), key, 1); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				if be.name == "postgres" {
					b.ReportMetric(float64(pg.n.Load())/float64(b.N), "round-trips/op")
				}
			})
		}
	}
}

// trips counts the statements a Store sends (a conflict's extra SELECT
// aside, which READ COMMITTED never needs).
type trips struct {
	*pglimit.Store
	n atomic.Int64
}

func (t *trips) Load(ctx context.Context, key string, now int64) (int64, error) {
	t.n.Add(1)
	return t.Store.Load(ctx, key, now)
}

func (t *trips) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	t.n.Add(1)
	return t.Store.CompareAndSwap(ctx, key, old, next, now, expires)
}

func (t *trips) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	t.n.Add(1)
	return t.Store.CompareAndSwapLoad(ctx, key, old, next, now, expires)
}
