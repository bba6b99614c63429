package slidinglog

import (
	"math"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
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
	throttletest.FuzzNoBypass(f, 1, 4*time.Millisecond, func(_, limit int, opts ...throttle.Option) (throttle.Limiter, error) {
		return New(limit, 256*time.Millisecond, opts...)
	})
}
