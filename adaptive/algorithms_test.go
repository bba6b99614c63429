package adaptive

import (
	"testing"
	"time"
)

const ms = time.Millisecond

// TestAlgorithms checks the direction each algorithm moves the limit in:
// up when the load tests the limit and the latency holds, down on a drop
// or a queue, and not at all when the load does not test the limit.
func TestAlgorithms(t *testing.T) {
	calm := Window{Samples: 100, AvgRTT: 10 * ms, MinRTT: 10 * ms, MaxInFlight: 50}
	queued := Window{Samples: 100, AvgRTT: 40 * ms, MinRTT: 10 * ms, MaxInFlight: 50}
	drop := Window{Samples: 90, Dropped: 10, AvgRTT: 10 * ms, MinRTT: 10 * ms, MaxInFlight: 50}
	idle := Window{Samples: 100, AvgRTT: 10 * ms, MinRTT: 10 * ms, MaxInFlight: 10}
	for _, tc := range []struct {
		name string
		alg  func() Algorithm
	}{
		{"AIMD", func() Algorithm { return &AIMD{} }},
		{"Vegas", func() Algorithm { return &Vegas{} }},
		{"Gradient2", func() Algorithm { return &Gradient2{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each algorithm learns the no-load RTT from calm windows.
			warm := func() Algorithm {
				a := tc.alg()
				for range 20 {
					a.Update(50, calm)
				}
				return a
			}
			if got := warm().Update(50, calm); got <= 50 {
				t.Errorf("calm: %v, want above 50", got)
			}
			if got := warm().Update(50, drop); got >= 50 {
				t.Errorf("drop: %v, want below 50", got)
			}
			if got := warm().Update(50, idle); got != 50 {
				t.Errorf("app-limited: %v, want 50", got)
			}
			if tc.name == "AIMD" { // loss-based: latency alone does not move it
				return
			}
			a := warm()
			for range 5 {
				a.Update(50, queued)
			}
			if got := a.Update(50, queued); got >= 50 {
				t.Errorf("queued: %v, want below 50", got)
			}
		})
	}
}
