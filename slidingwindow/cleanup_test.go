package slidingwindow

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
// weighted and slotted.
func TestCleanupKeepsLiveCounts(t *testing.T) {
	for _, slots := range []int{0, 4} {
		for _, w := range []time.Duration{time.Millisecond, 200 * time.Millisecond, time.Hour} {
			clk := throttletest.NewClock()
			l, err := newLimiter(3, w, slots, []throttle.Option{throttle.WithClock(clk)})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			held := clk.Now().UnixNano()
			clk.Advance(2 * w)
			for range 3 {
				if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
					t.Fatalf("slots=%d w=%v: fill denied", slots, w)
				}
			}
			sweepAt(l, held)
			if d, _ := l.Allow(ctx, "k", 1); d.Allowed {
				t.Errorf("slots=%d w=%v: a 4th unit admitted after a clean-up with an older clock reading", slots, w)
			}
			clk.Advance(2 * w)
			for range 3 {
				l.Allow(ctx, "j", 1)
			}
			past := clk.Now()
			clk.Advance(2*w + time.Second)
			swept := clk.Now()
			sweepAt(l, swept.UnixNano())
			clk.Set(past) // the held-up decision's reading
			if d, _ := l.Allow(ctx, "j", 3); !d.Allowed {
				t.Errorf("slots=%d w=%v: held-up decision denied: %+v", slots, w, d)
			}
			clk.Set(swept)
			if d, _ := l.Allow(ctx, "j", 1); d.Allowed {
				t.Errorf("slots=%d w=%v: held-up decision was counted before the clean-up's instant", slots, w)
			}
			l.Close()
		}
	}
}

// sweepAt runs a clean-up that read its clock at now. (Retire reads the
// clock itself, after loading each state, so now no longer matters.)
func sweepAt(l *Limiter, _ int64) {
	if l.wm != nil {
		l.wm.Sweep()
	} else {
		l.sm.Sweep()
	}
}
