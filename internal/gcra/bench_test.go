package gcra

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
)

var sinkI int64

// The floor of a decision: one clock read, then one clock read and one
// CAS. AllowN should cost little more than BenchmarkFloorClockCAS.
func BenchmarkFloorClock(b *testing.B) {
	var c clock.Source
	for b.Loop() {
		sinkI += c.Now()
	}
}

func BenchmarkFloorClockCAS(b *testing.B) {
	var c clock.Source
	var s State
	for b.Loop() {
		s.Take(c.Now(), 1, 1<<40)
	}
}

func BenchmarkAllowN(b *testing.B) {
	var s Single
	var d throttle.Decision
	if err := s.Init(throttle.NewRate(int(bridge.MaxPerSecond), time.Second), 1<<30); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.AllowN(&d, 1)
	}
}
