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
// per key kept in PostgreSQL (storelimit over this package's Store, the
// server running with fsync and synchronous_commit on; with
// synchronous_commit off for the limiter's connections; and a leasing
// limiter, batches of up to the burst, -pglimit.leaseage spendable), in
// Redis (redislimit's script) and in memory (storelimit.Memory, the cost
// of the loop itself), in one run, on the real (moving) clock: 16
// goroutines over 16 connections (-pglimit.callers sets another number),
// on 1000 keys (1000/s, burst 100: mostly admissions) and on one hot key
// (mostly denials) at 1000/s (burst 100) and 2000/s (burst 200). It
// reports decisions/s, admitted/s, on the hot key the admitted share of
// the bound burst + rate·t (of-limit), the 99th percentile of a
// decision's latency and, for PostgreSQL, the statements sent per
// decision (round-trips/op).
func BenchmarkBackends(b *testing.B) {
	for _, c := range []struct {
		name       string
		keys, rate int
		burst      int
	}{{"keys=1000", 1000, 1000, 100}, {"keys=1", 1, 1000, 100}, {"keys=1,rate=2000", 1, 2000, 200}} {
		for _, be := range backends(b, throttle.PerSecond(c.rate), c.burst) {
			b.Run(be.name+"/"+c.name, func(b *testing.B) {
				var statements atomic.Int64
				l := be.new(b, &statements)
				if c, ok := l.(interface{ Close() error }); ok {
					b.Cleanup(func() { c.Close() })
				}
				admitted, p99 := runParallel(b, l, c.keys)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric(float64(admitted)/b.Elapsed().Seconds(), "admitted/s")
				if c.keys == 1 { // of the bound burst + rate·t
					b.ReportMetric(float64(admitted)/(float64(c.burst)+float64(c.rate)*b.Elapsed().Seconds()), "of-limit")
				}
				b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
				if strings.HasPrefix(be.name, "postgres") {
					b.ReportMetric(float64(statements.Load())/float64(b.N), "round-trips/op")
				}
			})
		}
	}
}

// backend is a limiter under BenchmarkBackends: new builds it, counting
// its statements in statements when it has any.
type backend struct {
	name string
	new  func(b *testing.B, statements *atomic.Int64) throttle.Limiter
}

// backends are the limiters of one token bucket BenchmarkBackends
// compares. Statements are counted but for the SELECT after a conflict,
// which READ COMMITTED never needs.
func backends(b *testing.B, rate throttle.Rate, burst int) []backend {
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		b.Fatal(err)
	}
	pg := func(params map[string]string, lease int) func(*testing.B, *atomic.Int64) throttle.Limiter {
		return func(b *testing.B, statements *atomic.Int64) throttle.Limiter {
			s := storetest.Counted(newStore(b, newPoolWith(b, srv, int32(*callers), params), benchTimeout), statements)
			if lease == 0 {
				return newLimiter(b, s, alg)
			}
			l, err := storelimit.NewLeasing(s, alg, lease, *leaseAge)
			if err != nil {
				b.Fatal(err)
			}
			return l
		}
	}
	return []backend{
		{"postgres", pg(nil, 0)},
		// synchronous_commit off for the limiter's connections: a commit
		// does not wait for its WAL flush.
		{"postgres-async", pg(map[string]string{"synchronous_commit": "off"}, 0)},
		{"postgres-lease", pg(nil, burst)},
		{"redis", func(b *testing.B, _ *atomic.Int64) throttle.Limiter {
			c := redis.NewClient(&redis.Options{Addr: redistest.Start(b).Addr, PoolSize: *callers})
			b.Cleanup(func() { c.Close() })
			l, err := redislimit.NewTokenBucket(c, rate, burst, redislimit.WithTimeout(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			return l
		}},
		{"memory", func(b *testing.B, _ *atomic.Int64) throttle.Limiter {
			return newLimiter(b, new(storelimit.Memory), alg)
		}},
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
func newLimiter(t testing.TB, s throttle.Store, a throttle.Algorithm) *storelimit.Limiter {
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

// leaseAge is how long the leased units of the postgres-lease backend
// stay spendable.
var leaseAge = flag.Duration("pglimit.leaseage", 100*time.Millisecond, "maxAge of BenchmarkBackends' leasing limiter")

// benchTimeout is generous: the benchmark measures throughput on a machine
// that may be busy, not faults.
var benchTimeout = pglimit.WithTimeout(10 * time.Second)
