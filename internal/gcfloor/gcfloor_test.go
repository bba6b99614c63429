package gcfloor

import (
	"os"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, MaxPercent},
		{1 << 20, MaxPercent},    // 64 MiB would be 63 times the live heap
		{8 << 20, 700},           // a goal of 64 MiB
		{16 << 20, 300},          // a goal of 64 MiB
		{MinHeapGoal/2 - 1, 100}, // just below: twice the live heap is the goal
		{MinHeapGoal / 2, 100},   // Go's default from here on
		{1 << 30, 100},
	} {
		if got := Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d) = %d, want %d", tc.live, got, tc.want)
		}
	}
}

// Run raises the percent while the heap is small and sets Go's default
// back when stopped.
func TestRunStops(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: Run does nothing")
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { Run(time.Millisecond, stop); close(done) }()
	for deadline := time.Now().Add(5 * time.Second); Current() == 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the percent was never raised")
		}
	}
	close(stop)
	<-done
	if p := Current(); p != 100 {
		t.Errorf("percent %d after stop, want 100", p)
	}
}
