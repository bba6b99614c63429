// Package limitertest holds what the tests of the algorithm packages
// share beyond the conformance suite of package throttletest: building a
// limiter that fails the test instead of returning an error, running the
// suite on both limiters of a package, and the checks every keyed limiter
// with a key cap and a clean-up must pass.
package limitertest

import (
	"reflect"
	"testing"

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

// typeName is the name of the type L points to: Bucket for *tokenbucket.Bucket.
func typeName[L any]() string {
	if t := reflect.TypeFor[L](); t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return reflect.TypeFor[L]().Name()
}
