package slidinglog_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/benchutil"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/throttletest"
)

// Benchmarks on the system clock. "allowed" admits nearly every call (a
// limit far above the call rate); "denied" denies nearly every call.
// golang.org/x/time/rate runs beside for the ratio.

func BenchmarkAllow(b *testing.B) {
	cases := []struct {
		name   string
		limit  int
		window time.Duration
	}{
		{"allowed", 1 << 20, time.Millisecond},
		{"denied", 100, time.Hour},
	}
	for _, c := range cases {
		b.Run("Log/"+c.name, func(b *testing.B) {
			l := mustLog(b, c.limit, c.window)
			b.ReportAllocs()
			for b.Loop() {
				l.AllowN(1)
			}
		})
		b.Run("Limiter/"+c.name, func(b *testing.B) {
			l := mustNew(b, c.limit, c.window)
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(bg, "key", 1)
			}
		})
		b.Run("x-time-rate/"+c.name, func(b *testing.B) {
			l := rate.NewLimiter(rate.Limit(float64(c.limit)/c.window.Seconds()), c.limit)
			b.ReportAllocs()
			for b.Loop() {
				l.Allow()
			}
		})
	}
}

func BenchmarkAllowParallel(b *testing.B) {
	b.Run("Log", func(b *testing.B) {
		l := mustLog(b, 1<<20, time.Millisecond)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowN(1)
			}
		})
	})
	b.Run("Limiter/hotkey", func(b *testing.B) {
		l := mustNew(b, 1<<20, time.Millisecond)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(bg, "key", 1)
			}
		})
	})
	b.Run("Limiter/100k-keys", func(b *testing.B) {
		l := mustNew(b, 10, time.Second)
		benchutil.ParallelKeys(b, l, 100_000)
	})
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1<<20/0.001), 1<<20)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
}

// BenchmarkKeys spreads calls over 100k distinct keys, all live. In
// "allowed" every call is admitted (each adds an entry to its key's log,
// which grows by doubling); in "allowed-sparse" each log holds a few
// entries; in "allowed-tail" at most three, all inside the log's state;
// in "denied" every key is full for the hour.
func BenchmarkKeys(b *testing.B) {
	keys := benchutil.Keys(100_000)
	visit := benchutil.Visit(keys)
	// run visits the keys in turn, calling pass (if any) after each pass.
	run := func(b *testing.B, l *slidinglog.Limiter, pass func()) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Allow(bg, visit[i], 1)
			if i++; i == len(visit) {
				i = 0
				if pass != nil {
					pass()
				}
			}
		}
	}
	b.Run("allowed", func(b *testing.B) {
		l := mustNew(b, 1<<20, time.Hour)
		for _, k := range keys {
			l.Allow(bg, k, 1)
		}
		run(b, l, nil)
	})
	b.Run("allowed-sparse", func(b *testing.B) {
		// A pass over the keys takes tens of ms: a 100 ms window holds a
		// few entries per key, as most keys of a real limiter do.
		l := mustNew(b, 1<<20, 100*time.Millisecond)
		for _, k := range keys {
			l.Allow(bg, k, 1)
		}
		run(b, l, nil)
	})
	b.Run("allowed-tail", func(b *testing.B) {
		// Virtual time moves a second per pass over the keys, and the
		// window is three: every log holds at most three entries, all in
		// the log's own tail, and each call expires one.
		clk := throttletest.NewClock()
		l := mustNew(b, 1<<20, 3*time.Second, throttle.WithClock(clk))
		for _, k := range keys {
			l.Allow(bg, k, 1)
		}
		run(b, l, func() { clk.Advance(time.Second) })
	})
	b.Run("denied", func(b *testing.B) {
		l := mustNew(b, 10, time.Hour)
		for _, k := range keys {
			l.Allow(bg, k, 10)
		}
		run(b, l, nil)
	})
}
