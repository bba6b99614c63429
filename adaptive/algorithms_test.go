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

// TestGradient2NoDrift runs Gradient2 at its defaults on a saturated
// backend of 40 servers (every window's RTT is the service time stretched
// by the queue of a limit above 40), whose service time triples midway.
// The limit must settle near Tolerance × 40 rather than climb as the
// long-term RTT learns the queue, and must find the slower backend again
// (a limit of 40 or more) instead of staying pinned low.
func TestGradient2NoDrift(t *testing.T) {
	const servers = 40
	g := &Gradient2{}
	limit := 20.0
	run := func(windows int, service time.Duration) (most float64) {
		for range windows {
			in := int(limit)
			rtt := service * time.Duration(max(in, servers)) / servers
			limit = min(max(g.Update(limit, Window{Samples: 100, AvgRTT: rtt, MinRTT: rtt / 2, MaxInFlight: in}), 1), 1000)
			most = max(most, limit)
		}
		return most
	}
	if most := run(5000, 10*ms); most > 2*servers {
		t.Errorf("limit climbed to %.0f over 5000 windows at a fixed service time, want <= %d", most, 2*servers)
	}
	run(3000, 30*ms)
	if limit < servers || limit > 2*servers {
		t.Errorf("3000 windows after the service time tripled: limit %.0f, want within [%d, %d]", limit, servers, 2*servers)
	}
}

// TestGradient2ProbeAboveMin probes with a Config.Min above QueueSize:
// the Limiter holds the limit at Min, not QueueSize, and the probe must
// still end and give the limit back.
func TestGradient2ProbeAboveMin(t *testing.T) {
	const minLimit = 10
	g := &Gradient2{Probe: 50}
	limit := 30.0
	for i := range 200 {
		in := int(limit)
		limit = max(g.Update(limit, Window{Samples: 100, AvgRTT: 10 * ms, MinRTT: 5 * ms, MaxInFlight: in}), minLimit)
		if i >= 60 && i < 100 && limit <= minLimit {
			t.Fatalf("window %d: limit %v, still probing 10 windows after the probe began", i, limit)
		}
	}
}

// TestAIMDRTTLoss: at its defaults, AIMD backs off on a window whose mean
// RTT is above twice the RTT without a queue, with no drop and no
// timeout; RTTFactor -1 turns that off. Before, it only grew.
func TestAIMDRTTLoss(t *testing.T) {
	for _, tc := range []struct {
		a      *AIMD
		shrink bool
	}{{&AIMD{}, true}, {&AIMD{RTTFactor: -1}, false}} {
		w := Window{Samples: 100, AvgRTT: 10 * ms, MaxInFlight: 50}
		for range 10 { // 1000 successes at 10 ms: the RTT without a queue
			tc.a.Update(50, w)
		}
		w.AvgRTT = 25 * ms
		if got := tc.a.Update(50, w); (got < 50) != tc.shrink {
			t.Errorf("RTTFactor %v: limit 50 → %v at 2.5× the RTT without a queue", tc.a.RTTFactor, got)
		}
	}
}

// TestVegasSlowerPath: the RTT triples with no queue (a slower path):
// Vegas cuts the limit, sees that halving the requests in flight did not
// bring the RTT down, takes the new RTT as the RTT without a queue, and
// grows again. Before, it cut the limit down to its floor and stayed
// there until its next probe (1000 windows).
func TestVegasSlowerPath(t *testing.T) {
	v := &Vegas{}
	limit := 40.0
	for range 10 {
		limit = v.Update(limit, Window{Samples: 100, AvgRTT: 10 * ms, MaxInFlight: int(limit)})
	}
	least := limit
	for range 60 {
		limit = max(1, v.Update(limit, Window{Samples: 100, AvgRTT: 30 * ms, MaxInFlight: int(limit)}))
		least = min(least, limit)
	}
	if least > 25 || limit < 40 {
		t.Errorf("limit fell to %.0f and came back to %.0f; want to half of 50 or below, then at least 40", least, limit)
	}
}
