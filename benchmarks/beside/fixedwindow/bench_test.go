package fixedwindow_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/benchutil"
	"github.com/throttlekit/throttle/internal/limitertest"
)

// Benchmarks on the system clock. "allowed" admits every call (a limit far
// above the call rate, windows rolling every millisecond); "denied" denies
// every call. golang.org/x/time/rate runs beside for the ratio.

var benchCases = []struct {
	name   string
	limit  int
	window time.Duration
}{
	{"allowed", 1 << 30, time.Millisecond},
	{"denied", 1, time.Hour},
}

func BenchmarkAllow(b *testing.B) {
	for _, c := range benchCases {
		for _, kind := range kinds {
			b.Run("Window/"+kind.name+"/"+c.name, func(b *testing.B) {
				w := limitertest.New(b, kind.window, c.limit, c.window)
				w.AllowN(1)
				benchutil.Serial(b, func() { w.AllowN(1) })
			})
			b.Run("Limiter/"+kind.name+"/"+c.name, func(b *testing.B) {
				l := limitertest.New(b, kind.limiter, c.limit, c.window)
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
	for _, kind := range kinds {
		b.Run("Limiter/"+kind.name+"/100k-keys", func(b *testing.B) {
			l := limitertest.New(b, kind.limiter, 1<<20, time.Hour)
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
	b.Run("Window/hot", func(b *testing.B) {
		w := limitertest.New(b, fixedwindow.NewWindow, 1<<30, time.Millisecond)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				w.AllowN(1)
			}
		})
	})
	b.Run("Limiter/hotkey", func(b *testing.B) {
		l := limitertest.New(b, fixedwindow.New, 1<<30, time.Millisecond)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(bg, "key", 1)
			}
		})
	})
	b.Run("Limiter/100k-keys", func(b *testing.B) {
		l := limitertest.New(b, fixedwindow.New, 1<<20, time.Hour)
		benchutil.ParallelKeys(b, l, 100_000)
	})
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
