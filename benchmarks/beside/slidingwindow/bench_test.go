package slidingwindow_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/throttlekit/throttle/internal/benchutil"
)

// Benchmarks on the system clock. "allowed" admits every call (a limit far
// above the call rate, a 10ms window: weighted windows roll over every
// 10ms, slots every 1ms or 100µs); "denied" denies every call. golang.org/x/time/rate runs beside
// for the ratio.

var benchForms = []struct {
	name  string
	slots int
}{{"weighted", 0}, {"slotted10", 10}, {"slotted100", 100}}

var benchCases = []struct {
	name   string
	limit  int
	window time.Duration
}{
	{"allowed", 1<<24 - 1, 10 * time.Millisecond},
	{"denied", 1, time.Hour},
}

func BenchmarkAllow(b *testing.B) {
	for _, c := range benchCases {
		for _, bf := range benchForms {
			f := form{c.limit, c.window, bf.slots}
			b.Run("Window/"+bf.name+"/"+c.name, func(b *testing.B) {
				w := f.window1(b)
				w.AllowN(1)
				benchutil.Serial(b, func() { w.AllowN(1) })
			})
			b.Run("Limiter/"+bf.name+"/"+c.name, func(b *testing.B) {
				l := f.keyed(b)
				l.Allow(bg, "key", 1)
				benchutil.Serial(b, func() { l.Allow(bg, "key", 1) })
			})
		}
		b.Run("x-time-rate/"+c.name, func(b *testing.B) {
			l := rate.NewLimiter(rate.Limit(float64(c.limit)/c.window.Seconds()), c.limit)
			l.Allow()
			benchutil.Serial(b, func() { l.Allow() })
		})
	}
}

// BenchmarkKeys cycles through 100k distinct keys, all tracked.
func BenchmarkKeys(b *testing.B) {
	keys := benchutil.Keys(100_000)
	visit := benchutil.Visit(keys)
	for _, bf := range benchForms {
		b.Run("Limiter/"+bf.name+"/100k-keys", func(b *testing.B) {
			l := form{1 << 20, time.Hour, bf.slots}.keyed(b)
			for _, k := range keys {
				l.Allow(bg, k, 1)
			}
			i := 0
			benchutil.Serial(b, func() {
				l.Allow(bg, visit[i], 1)
				if i++; i == len(visit) {
					i = 0
				}
			})
		})
	}
}

func BenchmarkAllowParallel(b *testing.B) {
	for _, bf := range benchForms {
		f := form{1<<24 - 1, time.Millisecond, bf.slots}
		b.Run("Window/"+bf.name+"/hot", func(b *testing.B) {
			w := f.window1(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					w.AllowN(1)
				}
			})
		})
		b.Run("Limiter/"+bf.name+"/100k-keys", func(b *testing.B) {
			l := form{1 << 20, time.Hour, bf.slots}.keyed(b)
			benchutil.ParallelKeys(b, l, 100_000)
		})
	}
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(1e12, 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
}
