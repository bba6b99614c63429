package throttletest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// readmissions measures the eviction bypass of a keyed limiter bounded by
// throttle.WithMaxKeys, with time standing still: in each of rounds rounds
// a key takes its whole limit, then others distinct keys each take their
// whole limit (evicting it), then the key asks for one more unit. It
// returns in how many rounds that unit was admitted: 0 for a limiter that
// never lets an evicted key back in fresh.
func readmissions(l throttle.Limiter, limit, others, rounds int) int {
	ctx := context.Background()
	admitted := 0
	for r := range rounds {
		key := "victim-" + strconv.Itoa(r)
		l.Allow(ctx, key, limit)
		for i := range others {
			l.Allow(ctx, "churn-"+strconv.Itoa(r)+"-"+strconv.Itoa(i), limit)
		}
		if d, _ := l.Allow(ctx, key, 1); d.Allowed {
			admitted++
		}
	}
	return admitted
}

// FalseDenials floods l with keys distinct keys never seen before, each
// asking for n units, and returns how many of them were denied: keys held
// to a debt left by other keys that shared their table cells.
func FalseDenials(l throttle.Limiter, prefix string, n, keys int) int {
	ctx := context.Background()
	denied := 0
	for i := range keys {
		if d, _ := l.Allow(ctx, prefix+strconv.Itoa(i), n); !d.Allowed {
			denied++
		}
	}
	return denied
}

// noBypass drives l, a keyed limiter bounded by a small throttle.WithMaxKeys,
// and ref, the same limiter with no practical bound on keys, on the
// virtual clock clk (which both read) with the trace in steps, and fails t
// if l admits a request that ref, holding exactly what l admitted, would
// deny: eviction, the debt table and clean-up may only ever err toward
// denial. Each step takes 3 bytes: the key (one of 16), the units
// (1 to limit) and how far the clock moves first (0 to 255 units of
// tick). It is meant for fuzz targets of exact algorithms, whose decisions
// depend on admitted history only.
func noBypass(t testing.TB, l, ref throttle.Limiter, clk *Clock, limit int, tick time.Duration, steps []byte) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i+2 < len(steps); i += 3 {
		clk.Advance(time.Duration(steps[i+2]) * tick)
		key, n := "k"+strconv.Itoa(int(steps[i]%16)), 1+int(steps[i+1])%limit
		d, err := l.Allow(ctx, key, n)
		if err != nil {
			t.Fatalf("step %d: Allow(%q, %d): %v", i/3, key, n, err)
		}
		if !d.Allowed {
			continue
		}
		if r, err := ref.Allow(ctx, key, n); err != nil || !r.Allowed {
			t.Fatalf("step %d at %v: %q admitted %d units the unbounded limiter denies (%+v, %v)", i/3, clk.Now(), key, n, r, err)
		}
	}
}

// FuzzNoBypass is a fuzz target of noBypass at tick: newLimiter returns a
// keyed limiter of limit units (1 to 20) with opts, and the target checks
// it capped at 4 keys (of the 16 the steps use) against it uncapped. A
// package with several forms of its limiter (0 to forms-1) has each
// fuzzed. Limiters with a Close method are closed after each input.
func FuzzNoBypass(f *testing.F, forms int, tick time.Duration, newLimiter func(form, limit int, opts ...throttle.Option) (throttle.Limiter, error)) {
	for form := range forms {
		f.Add(uint8(0), uint8(form), []byte{0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 10, 0, 0, 11, 0, 0, 0, 0, 0}) // evicts k0, then asks again
		f.Add(uint8(1), uint8(form), []byte{0, 0, 10, 1, 0, 10, 2, 0, 10, 3, 0, 10, 4, 0, 10, 0, 0, 10})
	}
	f.Fuzz(func(t *testing.T, limit, form uint8, steps []byte) {
		lim, clk := 1+int(limit%20), NewClock()
		mk := func(opts ...throttle.Option) throttle.Limiter {
			l, err := newLimiter(int(form)%forms, lim, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if c, ok := l.(interface{ Close() error }); ok {
				t.Cleanup(func() { c.Close() })
			}
			return l
		}
		l := mk(throttle.WithClock(clk), throttle.WithMaxKeys(4))
		noBypass(t, l, mk(throttle.WithClock(clk)), clk, lim, tick, steps)
	})
}

// Eviction checks a keyed limiter bounded by throttle.WithMaxKeys against
// the eviction bypass. newLimiter returns a fresh limiter of limit units
// per key reading clk, capped at maxKeys keys; horizon is how long after
// its last admission a key is surely full again. It requires that:
//   - a key evicted while full is not admitted again (readmissions, with
//     caps of 10 and 1024 keys), and nobody is denied once horizon has
//     passed;
//   - floods of 2× and 10× MaxKeys new keys, each taking 1 of 10 units,
//     deny none of them (debts merged in the table only ever hold a key
//     to what it could have used).
func Eviction(t *testing.T, horizon time.Duration, newLimiter func(clk *Clock, limit, maxKeys int) (throttle.Limiter, error)) {
	t.Helper()
	mk := func(clk *Clock, limit, maxKeys int) throttle.Limiter {
		t.Helper()
		l, err := newLimiter(clk, limit, maxKeys)
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := l.(interface{ Close() error }); ok {
			t.Cleanup(func() { c.Close() })
		}
		return l
	}
	for _, c := range []struct{ max, others int }{{10, 50}, {1024, 1500}} {
		clk := NewClock()
		l := mk(clk, 1, c.max)
		if n := readmissions(l, 1, c.others, 10); n != 0 {
			t.Errorf("MaxKeys %d: evicted key readmitted in %d of 10 rounds", c.max, n)
		}
		clk.Advance(horizon)
		if denied := FalseDenials(l, "after", 1, c.max); denied != 0 {
			t.Errorf("MaxKeys %d: %d new keys denied after the horizon", c.max, denied)
		}
	}
	for _, k := range []int{2, 10} {
		l := mk(NewClock(), 10, 1024)
		if denied := FalseDenials(l, "flood", 1, k*1024); denied != 0 {
			t.Errorf("a flood of %d new keys taking 1 of 10 units denied %d of them", k*1024, denied)
		}
	}
}
