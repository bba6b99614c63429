package clock

import (
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
