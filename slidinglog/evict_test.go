package slidinglog

import (
	"math"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestEvictedKeyNotFresh: a key evicted by the MaxKeys cap while its log
// holds units must not come back with an empty log; and nobody is held
// once the window (plus the debt's grain) has passed.
func TestEvictedKeyNotFresh(t *testing.T) {
	throttletest.Eviction(t, time.Hour+time.Microsecond, func(clk *throttletest.Clock, limit, maxKeys int) (throttle.Limiter, error) {
		return New(limit, time.Hour, throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys))
	})
}

// TestDebt: a debt keeps its units and moves their instant later by less
// than one grain, across 1970 and at the ends of time; merging keeps the
// later instant and the larger count.
func TestDebt(t *testing.T) {
	for _, limit := range []int{1, 1000, 1 << 20, math.MaxInt32, 1 << 40} {
		p, err := newParams(limit, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		grain := int64(1) << p.grainBits()
		if p.grainBits() == 0 {
			grain = 2 // exact, but the earliest instant moves 1 ns (a debt is never 0)
		}
		for _, last := range []int64{math.MinInt64, -grain - 1, -1, 0, 1, grain - 1, grain, 1_700_000_000_123_456_789, math.MaxInt64 - grain} {
			for _, total := range []int64{1, p.limit} {
				d := p.debt(total, last)
				gotTotal, at := p.owed(d)
				wantTotal := total
				if p.grainBits() == 0 {
					wantTotal = p.limit // above 2^32-1: the log counts as full
				}
				if d == 0 || gotTotal != wantTotal || at < last || at-last >= grain {
					t.Errorf("limit %d: debt(%d, %d) = %x → (%d, %d)", limit, total, last, d, gotTotal, at)
				}
			}
		}
		dd := debts{&p}
		a, b := p.debt(1, 5*grain), p.debt(p.limit, 3*grain)
		if tot, at := p.owed(dd.Merge(a, b)); tot != p.limit || at != 5*grain {
			t.Errorf("limit %d: Merge = (%d, %d), want (%d, %d)", limit, tot, at, p.limit, 5*grain)
		}
		if dd.Paid(a, 5*grain+p.window-1) || !dd.Paid(a, 5*grain+p.window) {
			t.Errorf("limit %d: Paid wrong around the window's end", limit)
		}
	}
}

// FuzzNoBypass: with a cap of 4 keys on 16, the log never admits what an
// unbounded one holding the same admissions would deny.
func FuzzNoBypass(f *testing.F) {
	f.Add(uint8(0), []byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 10, 0, 0, 11, 0, 0, 0, 0, 0}) // evicts k0, then asks again
	f.Add(uint8(1), []byte{0, 0, 10, 1, 0, 10, 2, 0, 10, 3, 0, 10, 4, 0, 10, 0, 0, 10})
	f.Fuzz(func(t *testing.T, limit uint8, steps []byte) {
		lim := 1 + int(limit%20)
		clk := throttletest.NewClock()
		l := limitertest.New(t, New, lim, 256*time.Millisecond, throttle.WithClock(clk), throttle.WithMaxKeys(4))
		ref := limitertest.New(t, New, lim, 256*time.Millisecond, throttle.WithClock(clk))
		defer l.Close()
		defer ref.Close()
		throttletest.NoBypass(t, l, ref, clk, lim, 4*time.Millisecond, steps)
	})
}
