package clock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

type fixed time.Time

func (f fixed) Now() time.Time { return time.Time(f) }

func TestInjected(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := New(fixed(at)).Now(); got != at.UnixNano() {
		t.Fatalf("Now = %d, want %d", got, at.UnixNano())
	}
}

func TestSystemIsWallAnchoredAndMonotonic(t *testing.T) {
	var s Source
	a := s.Now()
	if d := time.Duration(a - time.Now().UnixNano()); d < -time.Second || d > time.Second {
		t.Fatalf("system Source is %v away from time.Now", d)
	}
	if b := s.Now(); b < a {
		t.Fatalf("went backwards: %d then %d", a, b)
	}
}

// TestSynctest checks that limiters on the default clock run on the
// virtual time of a synctest bubble.
func TestSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s Source
		a := s.Now()
		time.Sleep(time.Hour)
		if d := time.Duration(s.Now() - a); d != time.Hour {
			t.Fatalf("an hour of virtual sleep moved the clock %v", d)
		}
	})
}

func BenchmarkNow(b *testing.B) {
	var s Source
	for b.Loop() {
		s.Now()
	}
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := Sleep(t.Context(), time.Minute); err != nil || time.Since(start) != time.Minute {
			t.Fatalf("Sleep(1m) = %v after %v, want nil after 1m", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if err := Sleep(ctx, time.Minute); err != context.DeadlineExceeded || time.Since(start) != time.Second {
			t.Fatalf("Sleep(1m) under a 1s deadline = %v after %v, want DeadlineExceeded after 1s", err, time.Since(start))
		}
		if err := Sleep(ctx, 0); err != context.DeadlineExceeded {
			t.Fatalf("Sleep(0) on an ended ctx = %v, want its error", err)
		}
		if err := Sleep(t.Context(), -time.Second); err != nil {
			t.Fatalf("Sleep(-1s) = %v, want nil at once", err)
		}
	})
}
