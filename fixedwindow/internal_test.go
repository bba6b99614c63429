package fixedwindow

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/throttletest"
)

// TestLateReading: a caller whose clock reading is older than the window
// another caller already opened counts in that newer window; one far
// behind (beyond the skew) finds the state stale and starts afresh.
func TestLateReading(t *testing.T) {
	const W = int64(time.Second)
	base := int64(1767225600) * W
	for _, anchored := range []bool{false, true} {
		c, err := newConfig(3, time.Second, anchored)
		if err != nil {
			t.Fatal(err)
		}
		var w atomic.Int64
		decideAt(c, &w, base+W, 2) // opens the window [base+W, base+2W)
		d, _ := decideAt(c, &w, base+W-5, 1)
		if !d.Allowed || d.Remaining != 0 || d.ResetAfter != time.Duration(W+5) {
			t.Fatalf("anchored=%v: late reading: %+v, want counted in the newer window", anchored, d)
		}
		d, _ = decideAt(c, &w, base+W-5, 1)
		if d.Allowed || d.RetryAfter != time.Duration(W+5) {
			t.Fatalf("anchored=%v: late reading on a full newer window: %+v", anchored, d)
		}
		if c.full(w.Load(), base+W-5) || !c.full(w.Load(), base+2*W) {
			t.Fatalf("anchored=%v: full() disagrees", anchored)
		}
		// A reading far behind: the state is taken as stale.
		far := base - (c.skew+2)*W
		if anchored {
			far = base - (c.skew+2)<<c.shift - 2*W
		}
		if d, _ := decideAt(c, &w, far, 3); !d.Allowed {
			t.Fatalf("anchored=%v: reading far behind: %+v, want a fresh window", anchored, d)
		}
	}
}

func TestRetire(t *testing.T) {
	c, _ := newConfig(2, time.Second, false)
	var s state
	if !s.Retire(keyed.At(0), false) {
		t.Fatal("a fresh state is full and must retire")
	}
	s = state{}
	s.cfg.Store(c)
	now := int64(1767225600e9)
	decideAt(c, &s.w, now, 1)
	if s.Retire(keyed.At(now+int64(time.Second)-1), false) {
		t.Fatal("retired a state with units in its window")
	}
	if !s.Retire(keyed.At(now+int64(time.Second)), false) {
		t.Fatal("did not retire a state whose window closed")
	}
	if _, ok := decideAt(c, &s.w, now, 1); ok {
		t.Fatal("a dead state decided")
	}
	var f state
	f.cfg.Store(c)
	decideAt(c, &f.w, now, 1)
	if !f.Retire(keyed.At(now), true) {
		t.Fatal("forced retirement refused")
	}
}

// TestWindowsBefore1970: a fresh key before 1970 counts in the window of
// its reading, not in window 0 (which its fresh word names, and which lies
// ahead of every reading before 1970).
func TestWindowsBefore1970(t *testing.T) {
	clk := throttletest.NewClock()
	clk.Set(time.Unix(0, -516662194))
	l, err := newLimiter(6, 100*time.Millisecond, false, []throttle.Option{throttle.WithClock(clk)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if d, err := l.Allow(t.Context(), "k", 6); err != nil || d.ResetAfter != 16662194 {
		t.Fatalf("Allow = %+v, %v; want ResetAfter 16.662194ms, the end of the window of -0.6 s", d, err)
	}
	clk.Advance(16662194)
	if d, _ := l.Allow(t.Context(), "k", 6); !d.Allowed {
		t.Fatalf("denied in the next window: %+v", d)
	}
}

// decideAt is config.decide with its Decision filled.
func decideAt(c *config, w *atomic.Int64, now, n int64) (d throttle.Decision, live bool) {
	ok, count, end, live := c.decide(w, now, n)
	c.fill(&d, now, ok, count, end)
	return d, live
}
