package pglimit_test

import (
	"context"
	"flag"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	"github.com/throttlekit/throttle/tokenbucket"
)

// BenchmarkBackends measures decisions per second of one token bucket
// (burst 100, 1000/s) per key kept in PostgreSQL (storelimit over this
// package's Store, the server running with fsync and synchronous_commit
// on; and with synchronous_commit off for the limiter's connections), in
// Redis (redislimit's script) and in memory (storelimit.Memory, the cost
// of the loop itself), in one run, on the real (moving) clock: 16
// goroutines over 16 connections (-pglimit.callers sets another number),
// on 1000 keys (mostly admissions) and on one hot key (mostly denials,
// the limit's 1000/s admitted). It reports decisions/s, admitted/s, the
// 99th percentile of a decision's latency and, for PostgreSQL, the
// statements sent per decision (round-trips/op).
func BenchmarkBackends(b *testing.B) {
	rate, burst := throttle.PerSecond(1000), 100
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		b.Fatal(err)
	}
	var statements atomic.Int64
	backends := []struct {
		name string
		new  func(b *testing.B) throttle.Limiter
	}{
		{"postgres", func(b *testing.B) throttle.Limiter {
			// Statements are counted but for the SELECT after a conflict,
			// which READ COMMITTED never needs.
			statements.Store(0)
			s := storetest.Counted(newStore(b, newPool(b, srv, int32(*callers)), benchTimeout), &statements)
			return newLimiter(b, s, alg)
		}},
		{"postgres-async", func(b *testing.B) throttle.Limiter {
			// synchronous_commit off for the limiter's connections: a
			// commit does not wait for its WAL flush.
			statements.Store(0)
			pool := newPoolWith(b, srv, int32(*callers), map[string]string{"synchronous_commit": "off"})
			return newLimiter(b, storetest.Counted(newStore(b, pool, benchTimeout), &statements), alg)
		}},
		{"redis", func(b *testing.B) throttle.Limiter {
			c := redis.NewClient(&redis.Options{Addr: redistest.Start(b).Addr, PoolSize: *callers})
			b.Cleanup(func() { c.Close() })
			l, err := redislimit.NewTokenBucket(c, rate, burst, redislimit.WithTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			return l
		}},
		{"memory", func(b *testing.B) throttle.Limiter {
			return newLimiter(b, new(storelimit.Memory), alg)
		}},
	}
	for _, keys := range []int{1000, 1} {
		for _, be := range backends {
			b.Run(be.name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				l := be.new(b)
				admitted, p99 := runParallel(b, l, keys)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric(float64(admitted)/b.Elapsed().Seconds(), "admitted/s")
				b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
				if strings.HasPrefix(be.name, "postgres") {
					b.ReportMetric(float64(statements.Load())/float64(b.N), "round-trips/op")
				}
			})
		}
	}
}

// runParallel runs b.N decisions of one unit on l from about *callers
// goroutines over keys keys and returns how many were admitted and the
// 99th percentile of their latency.
func runParallel(b *testing.B, l throttle.Limiter, keys int) (int64, time.Duration) {
	var seq, admitted atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(max(1, *callers/runtime.GOMAXPROCS(0))) // about *callers goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			key := "k" + strconv.Itoa(int(seq.Add(1))%keys)
			start := time.Now()
			d, err := l.Allow(context.Background(), key, 1)
			if err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(start))
			if d.Allowed {
				admitted.Add(1)
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(lat) == 0 {
		return admitted.Load(), 0
	}
	slices.Sort(lat)
	return admitted.Load(), lat[len(lat)*99/100]
}

// newLimiter returns a storelimit.Limiter deciding with a over s on the
// real clock.
func newLimiter(t testing.TB, s storelimit.Store, a storelimit.Algorithm) *storelimit.Limiter {
	t.Helper()
	l, err := storelimit.New(s, a)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// callers is how many goroutines, over as many connections, the
// benchmarks run.
var callers = flag.Int("pglimit.callers", 16, "goroutines (and connections) of BenchmarkBackends")

// benchTimeout is generous: the benchmark measures throughput on a machine
// that may be busy, not faults.
var benchTimeout = pglimit.WithTimeout(10 * time.Second)
