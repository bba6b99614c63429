package slidingwindow

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
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
// an unbounded one holding the same admissions would deny.
func FuzzNoBypass(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 10, 0, 0, 11, 0, 0, 0, 0, 0}) // evicts k0, then asks again
	f.Add(uint8(1), uint8(4), []byte{0, 0, 10, 1, 0, 10, 2, 0, 10, 3, 0, 10, 4, 0, 10, 0, 0, 10})
	f.Fuzz(func(t *testing.T, limit, slots uint8, steps []byte) {
		lim, k := 1+int(limit%20), []int{0, 1, 2, 4, 8}[slots%5]
		clk := throttletest.NewClock()
		l, err := newLimiter(lim, 256*time.Millisecond, k, []throttle.Option{throttle.WithClock(clk), throttle.WithMaxKeys(4)})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := newLimiter(lim, 256*time.Millisecond, k, []throttle.Option{throttle.WithClock(clk)})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		defer ref.Close()
		throttletest.NoBypass(t, l, ref, clk, lim, 4*time.Millisecond, steps)
	})
}
