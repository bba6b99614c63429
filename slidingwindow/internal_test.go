package slidingwindow

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestLateReading: a caller whose clock reading is older than the window
// (slot) another caller already moved the state to counts there, as of
// its start; one far behind finds the state stale and starts afresh.
func TestLateReading(t *testing.T) {
	const W = int64(time.Second)
	base := int64(1767225600) * W
	for _, slots := range []int{0, 10} {
		c, err := newConfig(3, time.Second, slots)
		if err != nil {
			t.Fatal(err)
		}
		var w atomic.Int64
		var ring atomic.Pointer[[]atomic.Int64]
		decide := func(now, n int64) throttle.Decision {
			if slots == 0 {
				var d throttle.Decision
				ok, start, prev, cur, used, _ := c.decideWeighted(&w, now, n)
				c.fillWeighted(&d, now, n, ok, start, prev, cur, used)
				return d
			}
			d, _ := decideSlottedAt(c, &w, &ring, now, n)
			return d
		}
		unit := W
		if slots > 0 {
			unit = c.slot
		}
		decide(base+unit, 2)        // moves the state to the next window or slot
		d := decide(base+unit-5, 1) // a late reading
		if !d.Allowed || d.Remaining != 0 {
			t.Fatalf("slots=%d: late reading: %+v, want counted in the newer window", slots, d)
		}
		d = decide(base+unit-5, 1)
		if d.Allowed || d.RetryAfter <= 5 {
			t.Fatalf("slots=%d: late reading on a full newer window: %+v", slots, d)
		}
		full := c.fullSlotted
		if slots == 0 {
			full = c.fullWeighted
		}
		if full(w.Load(), base+unit-5) || !full(w.Load(), base+unit+2*W) {
			t.Fatalf("slots=%d: full() disagrees", slots)
		}
		if d := decide(base-(c.skew+2)*unit, 3); !d.Allowed {
			t.Fatalf("slots=%d: reading far behind: %+v, want a fresh state", slots, d)
		}
	}
}

// TestRingPublishRejectsStale: a writer that read the state before others
// admitted more in the same slot, or before the ring entry was reused for
// a later slot, cannot overwrite the entry with its older count.
func TestRingPublishRejectsStale(t *testing.T) {
	c, _ := newConfig(100, time.Second, 10)
	ring := make([]atomic.Int64, 10)
	c.publish(ring, 25, 7)
	c.publish(ring, 25, 4) // a stale writer of slot 25
	if got := c.count(ring, 25); got != 7 {
		t.Fatalf("count(25) = %d, want 7", got)
	}
	c.publish(ring, 35, 2) // the entry reused for slot 35
	c.publish(ring, 25, 9) // a writer a whole window late
	if c.count(ring, 35) != 2 || c.count(ring, 25) != 0 {
		t.Fatalf("entry = %d for 35, %d for 25; want 2 and 0", c.count(ring, 35), c.count(ring, 25))
	}
	if c.count(nil, 35) != 0 {
		t.Fatal("a nil ring is not empty")
	}
}

// TestWrappedIndexHeals: at MaxLimit the slot index keeps 15 bits, so a
// state idle for exactly 2^15+1 slots looks one slot old. Its stale count
// may deny for at most a window; it must not linger beyond.
func TestWrappedIndexHeals(t *testing.T) {
	c, _ := newConfig(MaxLimit, time.Second, 10)
	if c.lay.TagBits() != 15 {
		t.Fatalf("TagBits = %d, want 15", c.lay.TagBits())
	}
	var w atomic.Int64
	var ring atomic.Pointer[[]atomic.Int64]
	c.ringOf(&ring)
	now := int64(1767225600e9)
	for i := range 3 { // units in three slots, so the ring holds some
		if d, _ := decideSlottedAt(c, &w, &ring, now+int64(i)*c.slot, 1000); !d.Allowed {
			t.Fatal(d)
		}
	}
	now += (1<<15 + 3) * c.slot // looks like one slot after the last
	if d, _ := decideSlottedAt(c, &w, &ring, now, MaxLimit); d.Allowed {
		t.Fatal("want the stale units of the last slot taken for current")
	}
	// A slot later, only that stale slot's 1000 units count: the older
	// ring entries carry their true slot indexes and do not match.
	if d, _ := decideSlottedAt(c, &w, &ring, now+c.slot, MaxLimit-1000); !d.Allowed {
		t.Fatalf("%+v; only the last stale slot's 1000 units may count", d)
	}
	if d, _ := decideSlottedAt(c, &w, &ring, now+c.slot, 1); d.Allowed {
		t.Fatal("admitted past the limit")
	}
	if d, _ := decideSlottedAt(c, &w, &ring, now+2*c.slots*c.slot, MaxLimit); !d.Allowed {
		t.Fatalf("two windows later: %+v, want empty", d)
	}
}

// TestWindowsBefore1970: a fresh key before 1970 counts in the window (or
// slot) of its reading, not in window 0, which its fresh word names.
func TestWindowsBefore1970(t *testing.T) {
	for _, slots := range []int{0, 4} {
		clk := throttletest.NewClock()
		clk.Set(time.Unix(0, -516662194))
		l, err := newLimiter(6, 100*time.Millisecond, slots, []throttle.Option{throttle.WithClock(clk)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]time.Duration{0: 116662194, 4: 91662194}[slots] // the window of -0.6 s, the slot of -0.525 s
		if d, err := l.Allow(t.Context(), "k", 6); err != nil || d.ResetAfter != want {
			t.Fatalf("slots %d: Allow = %+v, %v; want ResetAfter %v", slots, d, err, want)
		}
		l.Close()
	}
}

// decideSlottedAt is config.decideSlotted returning the Decision.
func decideSlottedAt(c *config, w *atomic.Int64, ring *atomic.Pointer[[]atomic.Int64], now, n int64) (d throttle.Decision, live bool) {
	live = c.decideSlotted(&d, w, ring, now, n)
	return d, live
}
