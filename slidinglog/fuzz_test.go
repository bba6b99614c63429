package slidinglog

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

// FuzzBound drives a Log and a keyed Limiter with fuzzed steps (clock
// moves, including back, and weighted requests), requires both to decide
// exactly as the textbook log, and checks every window of what they
// admitted.
func FuzzBound(f *testing.F) {
	f.Add(uint16(3), uint32(1000), []byte{0, 1, 5, 1, 200, 2, 255, 3, 7, 1})
	f.Add(uint16(1), uint32(1), []byte{1, 0, 1, 0, 0, 0, 2, 0})
	f.Add(uint16(500), uint32(1<<31), []byte{255, 255, 128, 7, 3, 9})
	f.Fuzz(func(t *testing.T, limit16 uint16, window32 uint32, steps []byte) {
		limit := 1 + int(limit16%1000)
		window := time.Duration(1 + window32%(1<<30))
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, limit, window, throttle.WithClock(clk))
		kl := limitertest.New(t, New, limit, window, throttle.WithClock(clk))
		m := &model{limit: int64(limit), window: int64(window)}
		var admits []admit
		for i := 0; i+1 < len(steps); i += 2 {
			// The first byte moves the clock by a fraction of the window
			// (back when it is 255), the second picks n.
			switch a := steps[i]; a {
			case 255:
				clk.Advance(-window / 3)
			default:
				clk.Advance(window * time.Duration(a) / 64)
			}
			n := 1 + int(steps[i+1])%limit
			want := m.decide(clk.Now().UnixNano(), int64(n))
			if got, err := lg.AllowN(n); err != nil || got != want {
				t.Fatalf("step %d: Log = %+v, %v; want %+v", i/2, got, err, want)
			}
			if got, err := kl.Allow(t.Context(), "k", n); err != nil || got != want {
				t.Fatalf("step %d: Limiter = %+v, %v; want %+v", i/2, got, err, want)
			}
			if want.Allowed {
				admits = append(admits, admit{m.ts[len(m.ts)-1], int64(n)})
			}
		}
		checkWindows(t, admits, int64(limit), int64(window))
	})
}
