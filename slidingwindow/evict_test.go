package slidingwindow

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestEvictedKeyNotFresh: a key evicted by the MaxKeys cap while its
// window holds units must not come back with an empty window, in either
// form; and nobody is held once two windows have passed.
func TestEvictedKeyNotFresh(t *testing.T) {
	for _, slots := range []int{0, 1, 10} {
		throttletest.Eviction(t, 2*time.Hour, func(clk *throttletest.Clock, limit, maxKeys int) (throttle.Limiter, error) {
			return newLimiter(limit, time.Hour, slots, []throttle.Option{throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys)})
		})
	}
}

// TestDebtMerge: a merged debt is at least as strict as each debt, window
// by window.
func TestDebtMerge(t *testing.T) {
	c, err := newConfig(10, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := weightedDebts{c}
	lay := c.lay
	for _, tc := range []struct{ a, b, want int64 }{
		{lay.Pack2(5, 3, 4), lay.Pack2(5, 1, 7), lay.Pack2(5, 3, 7)},
		{lay.Pack2(4, 3, 4), lay.Pack2(5, 1, 2), lay.Pack2(5, 4, 2)}, // a's cur becomes prev
		{lay.Pack2(3, 9, 9), lay.Pack2(5, 1, 2), lay.Pack2(5, 1, 2)}, // a has left
	} {
		for _, swap := range []bool{false, true} {
			a, b := tc.a, tc.b
			if swap {
				a, b = b, a
			}
			if got := d.Merge(a, b); got != tc.want {
				t.Errorf("Merge(%x, %x) = %x, want %x", a, b, got, tc.want)
			}
		}
	}
	cs, err := newConfig(10, time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	ds, lay := slottedDebts{cs}, cs.lay
	if got, want := ds.Merge(lay.Pack2(10, 6, 1), lay.Pack2(12, 2, 2)), lay.Pack2(12, 6, 6); got != want {
		t.Errorf("slotted Merge = %x, want %x", got, want)
	}
	if got, want := ds.Merge(lay.Pack2(7, 6, 1), lay.Pack2(12, 2, 2)), lay.Pack2(12, 2, 2); got != want {
		t.Errorf("slotted Merge of a debt out of the window = %x, want %x", got, want)
	}
}

// FuzzNoBypass: with a cap of 4 keys on 16, the limiter never admits what
// an unbounded one holding the same admissions would deny, weighted or
// slotted.
func FuzzNoBypass(f *testing.F) {
	slots := []int{0, 1, 2, 4, 8}
	throttletest.FuzzNoBypass(f, len(slots), 4*time.Millisecond, func(form, limit int, opts ...throttle.Option) (throttle.Limiter, error) {
		return newLimiter(limit, 256*time.Millisecond, slots[form], opts)
	})
}

// TestCleanupKeepsLiveCounts: see limitertest.CleanupKeepsLiveCounts.
func TestCleanupKeepsLiveCounts(t *testing.T) {
	slots := []int{0, 4}
	limitertest.CleanupKeepsLiveCounts(t, 2, []string{"weighted", "slotted"}, func(form int, clk *throttletest.Clock, w time.Duration) (throttle.Limiter, func(), error) {
		l, err := newLimiter(3, w, slots[form], []throttle.Option{throttle.WithClock(clk)})
		return l, func() { sweep(l) }, err
	})
}

// sweep runs a clean-up of l.
func sweep(l *Limiter) {
	if l.wm != nil {
		l.wm.Sweep()
	} else {
		l.sm.Sweep()
	}
}
