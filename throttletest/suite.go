package throttletest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// Suite describes a limiter to Run.
type Suite struct {
	// New returns a fresh limiter that reads time from clk. It is called
	// once per sub-test.
	New func(t testing.TB, clk *Clock) throttle.Limiter
	// Limit is the capacity the limiter reports in Decision.Limit. A fresh
	// key admits exactly Limit units while time stands still.
	Limit int
	// Bound returns the most units the limiter may admit for one key in an
	// interval of length d starting from full capacity, e.g. burst +
	// rate·d for a token bucket. Nil skips the random-trace check.
	Bound func(d time.Duration) int64
	// Release, for concurrency limiters, gives back n units held under key
	// (capacity returns by release, not by time). Nil for rate limiters.
	Release func(l throttle.Limiter, key string, n int)
	// Single marks a limiter that guards one resource and ignores the key.
	Single bool
	// RetrySlack is how much later than RetryAfter the same request may
	// still be denied (0 for exact algorithms). It must never succeed
	// before RetryAfter.
	RetrySlack time.Duration
}

// Run runs the conformance suite against s.
func Run(t *testing.T, s Suite) {
	t.Helper()
	if s.New == nil || s.Limit <= 0 {
		t.Fatal("throttletest: Suite needs New and a positive Limit")
	}
	t.Run("Decision", s.testDecision)
	t.Run("BadInput", s.testBadInput)
	t.Run("Concurrent", s.testConcurrent)
	if !s.Single {
		t.Run("KeysIndependent", s.testKeys)
	}
	if s.Release == nil {
		t.Run("RetryAfterHonest", s.testRetryAfter)
		t.Run("ResetAfter", s.testResetAfter)
	} else {
		t.Run("Release", s.testRelease)
	}
	if s.Bound != nil {
		t.Run("NeverAboveBound", s.testBound)
	}
	t.Run("Instants", s.testInstants)
	t.Run("Reserve", s.testReserve)
	t.Run("CancelCopies", s.testCancelCopies)
	t.Run("Close", s.testClose)
}

var ctx = context.Background()

func allow(t testing.TB, l throttle.Limiter, key string, n int) throttle.Decision {
	t.Helper()
	d, err := l.Allow(ctx, key, n)
	if err != nil {
		t.Fatalf("Allow(%q, %d): %v", key, n, err)
	}
	if d.Allowed && d.RetryAfter != 0 {
		t.Fatalf("Allow(%q, %d) allowed with RetryAfter %v, want 0", key, n, d.RetryAfter)
	}
	if d.Remaining < 0 || d.Remaining > d.Limit || d.RetryAfter < 0 || d.ResetAfter < 0 {
		t.Fatalf("Allow(%q, %d) = %+v: fields out of range", key, n, d)
	}
	return d
}

// exhaust admits single units until a denial, returning how many were
// admitted and the denial.
func (s Suite) exhaust(t testing.TB, l throttle.Limiter, key string) (int, throttle.Decision) {
	t.Helper()
	for i := 0; i <= s.Limit; i++ {
		d := allow(t, l, key, 1)
		if !d.Allowed {
			return i, d
		}
	}
	t.Fatalf("%q admitted more than Limit=%d units with time standing still", key, s.Limit)
	return 0, throttle.Decision{}
}

func (s Suite) testDecision(t *testing.T) {
	l := s.New(t, NewClock())
	d := allow(t, l, "k", 1)
	if !d.Allowed || d.Limit != s.Limit || d.Remaining != s.Limit-1 {
		t.Fatalf("first Allow = %+v, want allowed, Limit %d, Remaining %d", d, s.Limit, s.Limit-1)
	}
	if s.Release == nil && d.ResetAfter <= 0 {
		t.Fatalf("first Allow = %+v, want ResetAfter > 0 once capacity is used", d)
	}
	n, den := s.exhaust(t, l, "k")
	if n != s.Limit-1 {
		t.Fatalf("admitted %d units in all, want exactly Limit=%d", n+1, s.Limit)
	}
	if den.Remaining != 0 || den.Limit != s.Limit {
		t.Fatalf("denial = %+v, want Remaining 0, Limit %d", den, s.Limit)
	}
	if s.Release == nil && den.RetryAfter <= 0 {
		t.Fatalf("denial = %+v, want RetryAfter > 0", den)
	}
}

func (s Suite) testBadInput(t *testing.T) {
	l := s.New(t, NewClock())
	cases := []struct {
		name string
		key  string
		n    int
		want error
	}{
		{"n=0", "k", 0, throttle.ErrInvalid},
		{"n<0", "k", -1, throttle.ErrInvalid},
		{"n>limit", "k", s.Limit + 1, throttle.ErrExceedsLimit},
	}
	if !s.Single {
		cases = append(cases,
			struct {
				name string
				key  string
				n    int
				want error
			}{"empty key", "", 1, throttle.ErrInvalid},
			struct {
				name string
				key  string
				n    int
				want error
			}{"1MiB key", strings.Repeat("k", 1<<20), 1, throttle.ErrInvalid})
	}
	for _, c := range cases {
		d, err := l.Allow(ctx, c.key, c.n)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Allow err = %v, want %v", c.name, err, c.want)
		}
		if d.Allowed {
			t.Errorf("%s: Allow admitted a bad request: %+v", c.name, d)
		}
	}
	// Bad requests must not have consumed anything.
	if n, _ := s.exhaust(t, l, "k"); n != s.Limit {
		t.Errorf("after bad requests a fresh key admitted %d, want %d", n, s.Limit)
	}
}

func (s Suite) testConcurrent(t *testing.T) {
	l := s.New(t, NewClock())
	const workers = 8
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; i < 4*s.Limit/workers+8; i++ {
				d, err := l.Allow(ctx, "hot", 1)
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != int64(s.Limit) {
		t.Fatalf("%d goroutines admitted %d units with time standing still, want exactly %d", workers, got, s.Limit)
	}
}

func (s Suite) testKeys(t *testing.T) {
	l := s.New(t, NewClock())
	s.exhaust(t, l, "a")
	if d := allow(t, l, "b", 1); !d.Allowed || d.Remaining != s.Limit-1 {
		t.Fatalf("key b after exhausting a: %+v, want a fresh key", d)
	}
}

// exactStarts are the instants the exactness checks start at: the usual
// one, before 1970, half a second before 1970 (so that a trace crosses
// it) and late in the int64 range.
var exactStarts = []time.Time{
	Epoch,
	time.Date(1960, 6, 1, 0, 0, 0, 0, time.UTC),
	time.Unix(0, -int64(time.Second/2)),
	time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC),
}

func (s Suite) testRetryAfter(t *testing.T) {
	for i, n := range []int{1, max(1, s.Limit/2), s.Limit, 1, 1, 1} {
		clk := NewClock()
		if i >= 3 {
			clk.Set(exactStarts[i-2])
		}
		l := s.New(t, clk)
		s.exhaust(t, l, "k")
		clk.Advance(time.Millisecond) // off any boundary
		d := allow(t, l, "k", n)
		if d.Allowed {
			continue // time alone made room
		}
		if d.RetryAfter > 1 {
			clk.Advance(d.RetryAfter - 1)
			if e := allow(t, l, "k", n); e.Allowed {
				t.Fatalf("n=%d from %v: admitted 1ns before RetryAfter=%v", n, clk.Now(), d.RetryAfter)
			}
			clk.Advance(1)
		} else {
			clk.Advance(d.RetryAfter)
		}
		e := allow(t, l, "k", n)
		if !e.Allowed && s.RetrySlack > 0 {
			clk.Advance(s.RetrySlack)
			e = allow(t, l, "k", n)
		}
		if !e.Allowed {
			t.Fatalf("n=%d at %v: denied after waiting RetryAfter=%v (+slack %v): %+v", n, clk.Now(), d.RetryAfter, s.RetrySlack, e)
		}
	}
}

func (s Suite) testResetAfter(t *testing.T) {
	for _, t0 := range exactStarts {
		clk := NewClock()
		clk.Set(t0)
		l := s.New(t, clk)
		s.exhaust(t, l, "k")
		clk.Advance(time.Millisecond)
		d := allow(t, l, "k", 1)
		clk.Advance(d.ResetAfter)
		if n, _ := s.exhaust(t, l, "k"); n != s.Limit {
			t.Fatalf("from %v: after ResetAfter=%v the key admitted %d, want full Limit=%d", t0, d.ResetAfter, n, s.Limit)
		}
	}
}

func (s Suite) testRelease(t *testing.T) {
	l := s.New(t, NewClock())
	s.exhaust(t, l, "k")
	s.Release(l, "k", 1)
	if d := allow(t, l, "k", 1); !d.Allowed {
		t.Fatalf("after releasing 1 unit: %+v, want allowed", d)
	}
}

func (s Suite) testBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trace := range 20 {
		clk := NewClock()
		l := s.New(t, clk)
		start := clk.Now()
		step := time.Duration(1 + rng.Int64N(int64(time.Second)))
		var admitted int64
		for range 2000 {
			clk.Advance(time.Duration(rng.Int64N(int64(step))))
			n := 1 + rng.IntN(min(s.Limit, 4))
			if allow(t, l, "k", n).Allowed {
				admitted += int64(n)
			}
			if b := s.Bound(clk.Now().Sub(start)); admitted > b {
				t.Fatalf("trace %d: admitted %d within %v, bound %d", trace, admitted, clk.Now().Sub(start), b)
			}
		}
	}
}

// instants are clock readings across the whole int64 nanosecond range:
// its ends (1677 and 2262), before and after 1970.
var instants = []time.Time{
	time.Unix(0, math.MinInt64).UTC(),
	time.Date(1678, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(1960, 6, 1, 0, 0, 0, 0, time.UTC),
	time.Unix(0, -1).UTC(),
	time.Unix(0, 0).UTC(),
	time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC),
	time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Unix(0, math.MaxInt64-int64(5*time.Second)).UTC(),
	time.Unix(0, math.MaxInt64).UTC(),
}

// testInstants starts a limiter at each of instants: a fresh key admits at
// most Limit units while time stands still, and (with Bound) at most
// Bound(d) while time moves on for as long as the range lasts. A limiter
// may refuse an instant it cannot represent its state at with an error
// wrapping ErrInvalid, never wrap around or panic.
func (s Suite) testInstants(t *testing.T) {
	for _, t0 := range instants {
		clk := NewClock()
		clk.Set(t0)
		l := s.New(t, clk)
		admitted, refused := int64(0), 0
		count := func() {
			d, err := l.Allow(ctx, "k", 1)
			switch {
			case err != nil && !errors.Is(err, throttle.ErrInvalid):
				t.Fatalf("at %v: Allow: %v, want nil or an error wrapping ErrInvalid", t0, err)
			case err != nil:
				refused++
			case d.Allowed:
				admitted++
			}
		}
		for range 3 * s.Limit {
			count()
		}
		if admitted > int64(s.Limit) {
			t.Errorf("at %v: admitted %d at one instant, limit %d", t0, admitted, s.Limit)
		}
		if s.Bound == nil || s.Release != nil {
			continue
		}
		for step := 0; step < 200 && clk.ns.Load() <= math.MaxInt64-int64(time.Second); step++ {
			clk.Advance(time.Second / 10)
			count()
			if b := s.Bound(clk.Now().Sub(t0)); admitted > b {
				t.Fatalf("at %v: admitted %d within %v, bound %d", t0, admitted, clk.Now().Sub(t0), b)
			}
		}
		if refused > 0 {
			t.Logf("at %v: %d calls refused", t0, refused)
		}
	}
}

// exhaustedReserver returns a new limiter with key "k" exhausted, as a
// Reserver, or skips t if it is not one.
func (s Suite) exhaustedReserver(t *testing.T) (throttle.Limiter, throttle.Reserver) {
	t.Helper()
	l := s.New(t, NewClock())
	r, ok := l.(throttle.Reserver)
	if !ok {
		t.Skip("limiter does not implement throttle.Reserver")
	}
	s.exhaust(t, l, "k")
	return l, r
}

func (s Suite) testReserve(t *testing.T) {
	l, r := s.exhaustedReserver(t)
	den := allow(t, l, "k", 1)
	res, err := r.Reserve(ctx, "k", 1, 0)
	if err != nil || res.OK {
		t.Fatalf("Reserve with maxWait 0 on an empty bucket = %+v, %v; want not OK", res, err)
	}
	first, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !first.OK || first.Delay != den.RetryAfter {
		t.Fatalf("Reserve = %+v, %v; want OK with Delay = RetryAfter %v", first, err, den.RetryAfter)
	}
	second, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !second.OK || second.Delay <= first.Delay {
		t.Fatalf("second Reserve = %+v, %v; want OK, later than %v (FIFO)", second, err, first.Delay)
	}
	if res, err := r.Reserve(ctx, "k", 1, second.Delay); err != nil || res.OK {
		t.Fatalf("Reserve beyond maxWait = %+v, %v; want not OK", res, err)
	}
	second.Cancel()
	again, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !again.OK || again.Delay != second.Delay {
		t.Fatalf("Reserve after Cancel = %+v, %v; want the cancelled slot at %v", again, err, second.Delay)
	}
	if _, err := r.Reserve(ctx, "k", s.Limit+1, time.Hour); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("Reserve(n > limit) err = %v, want ErrExceedsLimit", err)
	}
}

// testCancelCopies checks that a Reservation and its copies give the
// booking back once: A reserves, a copy is taken, A cancels, B books A's
// old slot, the copy cancels (which must not give back B's booking), and C
// must then land after B.
func (s Suite) testCancelCopies(t *testing.T) {
	_, r := s.exhaustedReserver(t)
	a, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !a.OK {
		t.Fatalf("Reserve A = %+v, %v", a, err)
	}
	aCopy := a
	a.Cancel()
	b, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !b.OK || b.Delay != a.Delay {
		t.Fatalf("Reserve B = %+v, %v; want A's cancelled slot at %v", b, err, a.Delay)
	}
	aCopy.Cancel()
	c, err := r.Reserve(ctx, "k", 1, time.Hour)
	if err != nil || !c.OK || c.Delay <= b.Delay {
		t.Fatalf("Reserve C = %+v, %v; want a slot after B's %v (a copy's Cancel refunded twice)", c, err, b.Delay)
	}
}

func (s Suite) testClose(t *testing.T) {
	l := s.New(t, NewClock())
	c, ok := l.(interface{ Close() error })
	if !ok {
		t.Skip("limiter has no Close")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("Allow after Close: err = %v, want ErrClosed", err)
	} else if repeatsPrefix(err.Error()) {
		t.Fatalf("Allow after Close: %q repeats a prefix", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
}

// repeatsPrefix reports whether an error text says the same "word:" prefix
// twice in a row, as in "throttle: throttle: limiter closed".
func repeatsPrefix(msg string) bool {
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] || strings.HasPrefix(parts[i], parts[i-1]+":") {
			return true
		}
	}
	return false
}
