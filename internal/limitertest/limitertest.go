// Package limitertest holds what the tests of the algorithm packages
// share beyond the conformance suite of package throttletest: building a
// limiter that fails the test instead of returning an error, and the
// checks every keyed limiter with a clean-up and a key cap must pass.
package limitertest

import (
	"testing"
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
