package fixedwindow

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestCleanupKeepsLiveCounts: see limitertest.CleanupKeepsLiveCounts.
func TestCleanupKeepsLiveCounts(t *testing.T) {
	limitertest.CleanupKeepsLiveCounts(t, 1, []string{"aligned", "anchored"}, func(form int, clk *throttletest.Clock, w time.Duration) (throttle.Limiter, func(), error) {
		l, err := newLimiter(3, w, form == 1, []throttle.Option{throttle.WithClock(clk)})
		return l, func() { l.m.Sweep() }, err
	})
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// TestCleanupStress races decisions on 64 keys (3 per 1 ms) against a
// sweeper every 50 µs on the real clock, and counts the units admitted in
// each (key, window): none may exceed the limit.
func TestCleanupStress(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock stress test")
	}
	const W = int64(time.Millisecond)
	l, err := New(3, time.Millisecond, throttle.WithClock(wallClock{}), throttle.WithSweepInterval(50*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type cell struct {
		key int
		end int64
	}
	counts := make([]map[cell]int, 2)
	done := make(chan struct{})
	deadline := time.Now().Add(3 * time.Second)
	for g := range counts {
		counts[g] = map[cell]int{}
		go func() {
			defer func() { done <- struct{}{} }()
			keys := []string{}
			for k := range 64 {
				keys = append(keys, string(rune('A'+k)))
			}
			for i := 0; time.Now().Before(deadline); i++ {
				k := i % 64
				t0 := time.Now().UnixNano()
				d, _ := l.Allow(context.Background(), keys[k], 1)
				t1 := time.Now().UnixNano()
				if !d.Allowed {
					continue
				}
				lo, hi := (t0+int64(d.ResetAfter)+W-1)/W, (t1+int64(d.ResetAfter))/W
				if lo == hi { // the window's end is known for sure
					counts[g][cell{k, lo}]++
				}
			}
		}()
	}
	<-done
	<-done
	over := 0
	for c, n := range counts[0] {
		if n+counts[1][c] > 3 {
			over++
		}
	}
	if over > 0 {
		t.Fatalf("%d (key, window) cells admitted more than the limit", over)
	}
}
