// Package limitertest holds what the tests of the algorithm packages
// share beyond package throttletest: building a limiter that fails the
// test instead of returning an error, running the conformance suite on
// both limiters of a package, the checks of zero values and of clean-ups
// racing decisions, and the heap a key holds.
package limitertest

import (
	"errors"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// New returns ctor(a, b, opts...), the shape of the constructors of the
// algorithm packages, failing t if it returns an error. A result with a
// Close method is closed when t ends.
func New[A, B, O, V any](t testing.TB, ctor func(A, B, ...O) (V, error), a A, b B, opts ...O) V {
	t.Helper()
	v, err := ctor(a, b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := any(v).(interface{ Close() error }); ok {
		t.Cleanup(func() { c.Close() })
	}
	return v
}

// Conformance runs the suite s of package throttletest on the two
// limiters a package builds of the same parameters a and b: single,
// guarding one resource (s.Single), and keyed. Each runs in a sub-test
// named by its type and name, as in Bucket/name and Limiter/name. s.New
// and s.Single are set here.
func Conformance[A, B any, S, K throttle.Limiter](t *testing.T, name string, s throttletest.Suite, single func(A, B, ...throttle.Option) (S, error), keyed func(A, B, ...throttle.Option) (K, error), a A, b B) {
	t.Helper()
	one, many := s, s
	one.New = func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
		return New(t, single, a, b, throttle.WithClock(clk))
	}
	many.New = func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
		return New(t, keyed, a, b, throttle.WithClock(clk))
	}
	one.Single, many.Single = true, false
	t.Run(typeName[S]()+"/"+name, func(t *testing.T) { throttletest.Run(t, one) })
	t.Run(typeName[K]()+"/"+name, func(t *testing.T) { throttletest.Run(t, many) })
}

// ZeroValues checks the zero values of a package's limiters: single (its
// type has AllowN) and keyed refuse a request with an error wrapping
// throttle.ErrInvalid; where they have these methods, Close returns nil,
// and Len and Limit return 0.
func ZeroValues(t *testing.T, single interface {
	AllowN(n int) (throttle.Decision, error)
}, keyed throttle.Limiter) {
	t.Helper()
	if _, err := single.AllowN(1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero %T: AllowN err = %v, want ErrInvalid", single, err)
	}
	if _, err := keyed.Allow(t.Context(), "k", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero %T: Allow err = %v, want ErrInvalid", keyed, err)
	}
	for _, l := range []any{single, keyed} {
		if c, ok := l.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				t.Errorf("zero %T: Close: %v", l, err)
			}
		}
		if c, ok := l.(interface{ Len() int }); ok && c.Len() != 0 {
			t.Errorf("zero %T: Len %d", l, c.Len())
		}
		if c, ok := l.(interface{ Limit() int }); ok && c.Limit() != 0 {
			t.Errorf("zero %T: Limit %d", l, c.Limit())
		}
	}
}

// Slotted returns the constructor of a sliding window of so many slots:
// weighted for 0, else slotted with slots bound.
func Slotted[V any](slots int, weighted func(int, time.Duration, ...throttle.Option) (V, error), slotted func(int, time.Duration, int, ...throttle.Option) (V, error)) func(int, time.Duration, ...throttle.Option) (V, error) {
	if slots == 0 {
		return weighted
	}
	return func(limit int, window time.Duration, opts ...throttle.Option) (V, error) {
		return slotted(limit, window, slots, opts...)
	}
}

// HeapPer returns the heap held by what build allocates and returns, per
// unit of n (a key, say), read after a garbage collection on each side.
func HeapPer(n int, build func() any) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// typeName is the name of L, or of the type it points to: Bucket for
// *tokenbucket.Bucket.
func typeName[L any]() string {
	t := reflect.TypeFor[L]()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// CleanupKeepsLiveCounts checks a keyed limiter of 3 units per window in
// each of its forms (named in forms), for windows of 1 ms, 200 ms and
// 1 h, against races with its clean-up: a clean-up that read its clock
// before a decision moved the key into a new window must not drop the key;
// and a decision whose clock reading predates a clean-up that dropped the
// key must not count "before" the dropped state. A key's count lasts span
// windows (2 for a sliding window); newLimiter returns the limiter of the
// form forms[form] reading clk, and a function that runs one clean-up of
// it.
func CleanupKeepsLiveCounts(t *testing.T, span int, forms []string, newLimiter func(form int, clk *throttletest.Clock, window time.Duration) (l throttle.Limiter, sweep func(), err error)) {
	for form, name := range forms {
		for _, w := range []time.Duration{time.Millisecond, 200 * time.Millisecond, time.Hour} {
			t.Run(name+"/"+w.String(), func(t *testing.T) {
				clk := throttletest.NewClock()
				l, sweep, err := newLimiter(form, clk, w)
				if err != nil {
					t.Fatal(err)
				}
				if c, ok := l.(interface{ Close() error }); ok {
					defer c.Close()
				}
				raceCleanup(t, l, clk, time.Duration(span)*w, sweep)
			})
		}
	}
}

// raceCleanup is one case of CleanupKeepsLiveCounts: a key's count lasts
// life on clk.
func raceCleanup(t *testing.T, l throttle.Limiter, clk *throttletest.Clock, life time.Duration, sweep func()) {
	// 1. The clean-up reads its clock, then is held up while the key opens
	// a later window and fills it.
	clk.Advance(life)
	for range 3 {
		if d, _ := l.Allow(t.Context(), "k", 1); !d.Allowed {
			t.Fatal("fill denied")
		}
	}
	sweep()
	if d, _ := l.Allow(t.Context(), "k", 1); d.Allowed {
		t.Error("a 4th unit admitted after a clean-up with an older clock reading")
	}
	// 2. A decision reads its clock while the window is full, is held up
	// past the window's end while a clean-up drops the key, then looks it
	// up: it must not count in the old window again.
	clk.Advance(life)
	for range 3 {
		l.Allow(t.Context(), "j", 1)
	}
	past := clk.Now()
	clk.Advance(life + time.Second)
	swept := clk.Now()
	sweep()
	clk.Set(past) // the held-up decision's reading
	if d, _ := l.Allow(t.Context(), "j", 3); !d.Allowed {
		t.Errorf("held-up decision denied: %+v", d)
	}
	clk.Set(swept)
	if d, _ := l.Allow(t.Context(), "j", 1); d.Allowed {
		t.Error("held-up decision was counted before the clean-up's instant")
	}
}
