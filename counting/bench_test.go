package counting

import (
	"context"
	"strconv"
	"testing"

	"golang.org/x/sync/semaphore"
)

// BenchmarkTakeRelease is the uncontended fast path: take one unit
// and give it back. golang.org/x/sync/semaphore runs beside for the ratio.
func BenchmarkTakeRelease(b *testing.B) {
	b.Run("Semaphore", func(b *testing.B) {
		s := mustSem(b, 100)
		b.ReportAllocs()
		for b.Loop() {
			if d, _ := s.AllowN(1); !d.Allowed {
				b.Fatal("AllowN denied")
			}
			s.Release(1)
		}
	})
	b.Run("Limiter", func(b *testing.B) {
		l, ctx := mustNew(b, 100), context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if d, _ := l.Allow(ctx, "key", 1); !d.Allowed {
				b.Fatal("Allow denied")
			}
			l.Release("key", 1)
		}
	})
	b.Run("x-sync-semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(100)
		b.ReportAllocs()
		for b.Loop() {
			if !s.TryAcquire(1) {
				b.Fatal("TryAcquire failed")
			}
			s.Release(1)
		}
	})
}

// BenchmarkHoldRelease is the blocking Hold when the units are free.
func BenchmarkHoldRelease(b *testing.B) {
	b.Run("Semaphore", func(b *testing.B) {
		s, ctx := mustSem(b, 100), context.Background()
		b.ReportAllocs()
		for b.Loop() {
			rel, err := s.Hold(ctx, "", 1)
			if err != nil {
				b.Fatal(err)
			}
			rel()
		}
	})
	b.Run("x-sync-semaphore", func(b *testing.B) {
		s, ctx := semaphore.NewWeighted(100), context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			s.Release(1)
		}
	})
}

// BenchmarkParallel: every goroutine takes and gives back a unit of one
// semaphore (contended, but never full).
func BenchmarkParallel(b *testing.B) {
	b.Run("Semaphore", func(b *testing.B) {
		s := mustSem(b, 1<<20)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.AllowN(1)
				s.Release(1)
			}
		})
	})
	b.Run("x-sync-semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1 << 20)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.TryAcquire(1)
				s.Release(1)
			}
		})
	})
}

// BenchmarkKeys spreads Allow over 100k keys that each hold one unit, so
// every key stays live.
func BenchmarkKeys(b *testing.B) {
	ctx := context.Background()
	l := mustNew(b, 1<<20)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
		l.Allow(ctx, keys[i], 1)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(ctx, keys[i], 1)
		if i++; i == len(keys) {
			i = 0
		}
	}
}
