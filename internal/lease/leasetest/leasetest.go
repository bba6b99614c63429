// Package leasetest holds the checks the tests of the leasing backends
// (redislimit's buckets, storelimit's limiters) share.
package leasetest

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// Trace runs n decisions of one or two units on key "api", each on a
// limiter of ls drawn at random from seed, with clk advanced up to 400 µs
// before each, and returns the instant of every admitted unit (one entry
// per unit, from the trace's start) and the time the trace took.
func Trace[L throttle.Limiter](t testing.TB, ls []L, clk *throttletest.Clock, seed uint64, n int) (at []time.Duration, elapsed time.Duration) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	start := clk.Now()
	for range n {
		clk.Advance(time.Duration(rng.Int64N(int64(400 * time.Microsecond))))
		units := 1 + rng.IntN(2)
		d, err := ls[rng.IntN(len(ls))].Allow(context.Background(), "api", units)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			for range units {
				at = append(at, clk.Now().Sub(start))
			}
		}
	}
	return at, clk.Now().Sub(start)
}

// CheckBound fails t if the units admitted at the instants at (one entry
// per unit, from a key's fresh start) exceed a token bucket of burst and
// rate: from the start at most burst + Events(d); in any interval of
// length d at most burst + Events(d + maxAge); and, when procs > 0, at
// most burst + Events(d) + 2·maxBatch·procs.
func CheckBound(t testing.TB, at []time.Duration, burst int64, rate throttle.Rate, maxAge time.Duration, maxBatch, procs int64) {
	t.Helper()
	slices.Sort(at)
	for i := range at {
		if got, b := int64(i+1), burst+rate.Events(at[i]); got > b {
			t.Fatalf("%d units by %v from the fresh start, bound %d", got, at[i], b)
		}
		for j := i; j < len(at); j++ {
			d, units := at[j]-at[i], int64(j-i+1)
			if b := burst + rate.Events(d+maxAge); units > b {
				t.Fatalf("%d units in %v, above burst + Events(d + maxAge) = %d", units, d, b)
			}
			if b := burst + rate.Events(d) + 2*maxBatch*procs; procs > 0 && units > b {
				t.Fatalf("%d units in %v, above burst + Events(d) + 2·maxBatch·P = %d", units, d, b)
			}
		}
	}
}

// CheckDenialLocal runs 100 decisions of one unit on a leasing limiter of
// a token bucket of burst 10 on clk, frozen: it fails t unless exactly
// the burst is admitted, each denial carries a RetryAfter, at most 10
// calls reach the store (calls, read after settle, which waits for the
// background refills), and a call after the RetryAfter is admitted.
func CheckDenialLocal(t testing.TB, l throttle.Limiter, clk *throttletest.Clock, calls func() int64, settle func()) {
	t.Helper()
	ctx := context.Background()
	admitted := 0
	for range 100 {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		} else if d.RetryAfter <= 0 {
			t.Fatalf("denial without RetryAfter: %+v", d)
		}
	}
	settle()
	if admitted != 10 {
		t.Fatalf("admitted %d with time frozen, want the burst 10", admitted)
	}
	if c := calls(); c > 10 {
		t.Fatalf("%d calls to the store for 100 decisions", c)
	}
	d, _ := l.Allow(ctx, "k", 1)
	clk.Advance(d.RetryAfter)
	if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v", d)
	}
}
