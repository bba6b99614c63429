package adaptive

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle/counting"
)

// BenchmarkAllowRelease is the uncontended hot path on one key: take a
// unit and give it back, reporting a 1ms RTT, beside counting.Semaphore's
// Allow and Release (compare with benchstat -col /impl).
func BenchmarkAllowRelease(b *testing.B) {
	b.Run("impl=Semaphore", func(b *testing.B) {
		s := mustSemaphore(1000)
		b.ReportAllocs()
		for b.Loop() {
			if d, _ := s.Allow(bg, "", 1); !d.Allowed {
				b.Fatal("denied")
			}
			s.Release(1)
		}
	})
	for _, alg := range []struct {
		name string
		alg  Algorithm
	}{{"AIMD", &AIMD{}}, {"Vegas", &Vegas{}}, {"Gradient2", &Gradient2{}}} {
		b.Run("impl="+alg.name, func(b *testing.B) {
			l, err := New(alg.alg, Config{Initial: 1000, Max: 1000})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if d, _ := l.Allow(bg, "", 1); !d.Allowed {
					b.Fatal("denied")
				}
				l.Release(1, time.Millisecond, Success)
			}
		})
	}
	b.Run("impl=Throttler", func(b *testing.B) {
		th, err := NewThrottler(ThrottlerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			th.Allow(bg, "", 1)
			th.Accept(1)
		}
	})
}

// BenchmarkParallel: every goroutine takes and gives back a unit of one
// limiter (contended, never full).
func BenchmarkParallel(b *testing.B) {
	b.Run("impl=Semaphore", func(b *testing.B) {
		s := mustSemaphore(1 << 20)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.Allow(bg, "", 1)
				s.Release(1)
			}
		})
	})
	b.Run("impl=Vegas", func(b *testing.B) {
		l, err := New(&Vegas{}, Config{Initial: maxLimit, Max: maxLimit})
		if err != nil {
			b.Fatal(err)
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(bg, "", 1)
				l.Release(1, time.Millisecond, Success)
			}
		})
	})
}

func mustSemaphore(n int) *counting.Semaphore {
	s, err := counting.NewSemaphore(n)
	if err != nil {
		panic(err)
	}
	return s
}
