package fixedwindow

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestCleanupKeepsLiveCounts: a clean-up that read its clock before a
// decision moved the key into a new window must not drop the key; and a
// decision whose clock reading predates a clean-up that dropped the key
// must not count "before" the dropped state. Windows 1 ms, 200 ms, 1 h,
// aligned and anchored.
func TestCleanupKeepsLiveCounts(t *testing.T) {
	for _, anchored := range []bool{false, true} {
		for _, w := range []time.Duration{time.Millisecond, 200 * time.Millisecond, time.Hour} {
			clk := throttletest.NewClock()
			l, err := newLimiter(3, w, anchored, []throttle.Option{throttle.WithClock(clk)})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			// 1. The clean-up reads its clock, then is held up while the key
			// opens a later window and fills it.
			held := l.m.Now()
			clk.Advance(w)
			for range 3 {
				if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
					t.Errorf("anchored=%v w=%v: fill denied", anchored, w)
				}
			}
			sweepAt(l, held)
			if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
				t.Errorf("anchored=%v w=%v: a 4th unit admitted after a clean-up with an older clock reading", anchored, w)
			}
			// 2. A decision reads its clock while the window is full, is held
			// up past the window's end while a clean-up drops the key, then
			// looks it up: it must not count in the old window again.
			clk.Advance(w)
			for range 3 {
				l.Allow(ctx, "j", 1)
			}
			past := clk.Now()
			clk.Advance(w + time.Second)
			swept := clk.Now()
			sweepAt(l, l.m.Now())
			clk.Set(past) // the held-up decision's reading
			if d, _ := l.Allow(ctx, "j", 3); !d.Allowed {
				t.Errorf("anchored=%v w=%v: held-up decision denied: %+v", anchored, w, d)
			}
			clk.Set(swept)
			if d, _ := l.Allow(ctx, "j", 1); d.Allowed {
				t.Errorf("anchored=%v w=%v: held-up decision was counted before the clean-up's instant", anchored, w)
			}
			l.Close()
		}
	}
}

// sweepAt runs a clean-up that read its clock at now. (Retire reads the
// clock itself, after loading each state, so now no longer matters.)
func sweepAt(l *Limiter, _ int64) { l.m.Sweep() }

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
