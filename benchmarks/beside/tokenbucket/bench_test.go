package tokenbucket_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"golang.org/x/time/rate"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/benchutil"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/tokenbucket"
)

// The allowed path uses the fastest valid rate (one unit per ns) and a
// big burst: a call takes longer than the unit it costs, so every call is
// admitted. The denied path uses one unit per hour, already taken.
const bigBurst = 1 << 30

func benchBucket(b *testing.B, allowed bool) *tokenbucket.Bucket {
	r, burst := throttle.NewRate(int(bridge.MaxPerSecond), time.Second), bigBurst
	if !allowed {
		r, burst = throttle.NewRate(1, time.Hour), 1
	}
	tb, err := tokenbucket.NewBucket(r, burst)
	if err != nil {
		b.Fatal(err)
	}
	if !allowed {
		tb.AllowN(1)
	}
	return tb
}

func benchXRate(allowed bool) *rate.Limiter {
	if allowed {
		return rate.NewLimiter(rate.Limit(1e9), bigBurst)
	}
	l := rate.NewLimiter(rate.Every(time.Hour), 1)
	l.Allow()
	return l
}

func check(b *testing.B, got, want bool) {
	if got != want {
		b.Fatalf("allowed = %v, want %v", got, want)
	}
}

func BenchmarkSingle(b *testing.B) {
	for _, allowed := range []bool{true, false} {
		name := map[bool]string{true: "allowed", false: "denied"}[allowed]
		b.Run("xrate/"+name+"/serial", func(b *testing.B) {
			l := benchXRate(allowed)
			b.ReportAllocs()
			for b.Loop() {
				check(b, l.Allow(), allowed)
			}
		})
		b.Run("tokenbucket/"+name+"/serial", func(b *testing.B) {
			tb := benchBucket(b, allowed)
			b.ReportAllocs()
			for b.Loop() {
				d, _ := tb.AllowN(1)
				check(b, d.Allowed, allowed)
			}
		})
		b.Run("xrate/"+name+"/parallel", func(b *testing.B) {
			l := benchXRate(allowed)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if l.Allow() != allowed {
						b.Error("unexpected decision")
						return
					}
				}
			})
		})
		b.Run("tokenbucket/"+name+"/parallel", func(b *testing.B) {
			tb := benchBucket(b, allowed)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, _ := tb.AllowN(1); d.Allowed != allowed {
						b.Error("unexpected decision")
						return
					}
				}
			})
		})
	}
}

// BenchmarkKeyed measures the keyed Limiter on one key and on 100k
// distinct keys, all inserted before the timer starts and visited in the
// order of benchutil.Visit.
func BenchmarkKeyed(b *testing.B) {
	for _, nkeys := range []int{1, 100_000} {
		for _, allowed := range []bool{true, false} {
			// One key: one unit per ns, as for Bucket. Many keys: one unit
			// per second and a burst of 2^20, so that no key is ever full
			// again (full keys are dropped and would be re-inserted).
			r, burst := throttle.NewRate(int(bridge.MaxPerSecond), time.Second), bigBurst
			if nkeys > 1 {
				r, burst = throttle.PerSecond(1), 1<<20
			}
			if !allowed {
				r, burst = throttle.NewRate(1, time.Hour), 1
			}
			keys := benchutil.Keys(nkeys)
			visit := benchutil.Visit(keys)
			name := strconv.Itoa(nkeys) + "keys/" + map[bool]string{true: "allowed", false: "denied"}[allowed]
			setup := func(b *testing.B) *tokenbucket.Limiter {
				l, err := tokenbucket.New(r, burst)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { l.Close() })
				for _, k := range keys {
					l.Allow(bg, k, 1)
				}
				return l
			}
			b.Run(name+"/serial", func(b *testing.B) {
				l := setup(b)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					d, _ := l.Allow(bg, visit[i], 1)
					check(b, d.Allowed, allowed)
					if i++; i == len(visit) {
						i = 0
					}
				}
			})
			b.Run(name+"/parallel", func(b *testing.B) {
				l := setup(b)
				b.ReportAllocs()
				var worker atomic.Int64
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := int(worker.Add(1)*7919) % len(visit) // each goroutine at its own place
					for pb.Next() {
						if d, _ := l.Allow(bg, visit[i], 1); d.Allowed != allowed {
							b.Error("unexpected decision")
							return
						}
						if i++; i == len(visit) {
							i = 0
						}
					}
				})
			})
		}
	}
}

// BenchmarkPairedSerial alternates batches of x/time/rate calls, Bucket
// calls and bare clock reads on the same goroutine and reports each one's
// ns/op and the ratios: all see the same machine load, so the ratios are
// stable even when the absolute numbers are not. clock/xrate is the floor
// of bucket/xrate: a decision must read the clock once.
func BenchmarkPairedSerial(b *testing.B) {
	for _, allowed := range []bool{true, false} {
		b.Run(map[bool]string{true: "allowed", false: "denied"}[allowed], func(b *testing.B) {
			xl, tb := benchXRate(allowed), benchBucket(b, allowed)
			var clk clock.Source
			var sink int64
			const batch = 1000
			var tx, tt, tc time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				n := min(batch, b.N-done)
				t0 := time.Now()
				for range n {
					if xl.Allow() != allowed {
						b.Fatal("unexpected x/time/rate decision")
					}
				}
				t1 := time.Now()
				for range n {
					if d, _ := tb.AllowN(1); d.Allowed != allowed {
						b.Fatal("unexpected Bucket decision")
					}
				}
				t2 := time.Now()
				for range n {
					sink += clk.Now()
				}
				tc += time.Since(t2)
				tt += t2.Sub(t1)
				tx += t1.Sub(t0)
			}
			if sink == 0 {
				b.Fatal("clock read 0")
			}
			b.ReportMetric(float64(tx)/float64(b.N), "xrate-ns/op")
			b.ReportMetric(float64(tt)/float64(b.N), "bucket-ns/op")
			b.ReportMetric(float64(tc)/float64(b.N), "clock-ns/op")
			b.ReportMetric(float64(tt)/float64(tx), "bucket/xrate")
			b.ReportMetric(float64(tc)/float64(tx), "clock/xrate")
		})
	}
}
