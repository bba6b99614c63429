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
	var statements atomic.Int64
	backends := []struct {
		name string
		new  func(b *testing.B) throttle.Limiter
	}{
		{"postgres", func(b *testing.B) throttle.Limiter {
			// A generous timeout: the benchmark measures throughput, not faults.
			// Statements are counted but for the SELECT after a conflict,
			// which READ COMMITTED never needs.
			statements.Store(0)
			s := storetest.Counted(newStore(b, newPool(b, srv, 16), pglimit.WithTimeout(30*time.Second)), &statements)
			return storetest.NewLimiter(b, s, alg, clk)
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
					b.ReportMetric(float64(statements.Load())/float64(b.N), "round-trips/op")
				}
			})
		}
	}
}
