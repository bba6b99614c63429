package redislimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestNamespaces: two limiters of one algorithm and different limits on
// one server, without WithPrefix, keep each key's state apart (before, a
// second bucket's first call saw the first bucket's use: Remaining 1
// instead of 2), for every algorithm; with one WithPrefix they share it,
// on purpose.
func TestNamespaces(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	clk := throttletest.NewClock()
	opt := WithOptions(throttle.WithClock(clk))
	key := strings.TrimSuffix(uniquePrefix(), ":") // a key no other test uses
	type pair struct {
		name string
		new  func(limit int, o ...Option) (throttle.Limiter, error)
	}
	for _, p := range []pair{
		{"TokenBucket", func(l int, o ...Option) (throttle.Limiter, error) {
			return NewTokenBucket(c, throttle.PerSecond(1), l, o...)
		}},
		{"FixedWindow", func(l int, o ...Option) (throttle.Limiter, error) { return NewFixedWindow(c, l, time.Hour, o...) }},
		{"SlidingWindow", func(l int, o ...Option) (throttle.Limiter, error) { return NewSlidingWindow(c, l, time.Hour, o...) }},
		{"SlidingLog", func(l int, o ...Option) (throttle.Limiter, error) { return NewSlidingLog(c, l, time.Hour, o...) }},
		{"Concurrency", func(l int, o ...Option) (throttle.Limiter, error) { return NewConcurrency(c, l, time.Hour, o...) }},
	} {
		t.Run(p.name, func(t *testing.T) {
			remaining := func(limit int, o ...Option) int {
				t.Helper()
				l, err := p.new(limit, append(o, opt)...)
				if err != nil {
					t.Fatal(err)
				}
				d, err := l.Allow(context.Background(), key, 1)
				if err != nil || !d.Allowed {
					t.Fatalf("Allow = %+v, %v", d, err)
				}
				return d.Remaining
			}
			remaining(5)
			if got := remaining(3); got != 2 {
				t.Errorf("a second limiter of limit 3, default prefix: first call left %d, want 2 (state of its own)", got)
			}
			shared := WithPrefix(uniquePrefix())
			remaining(5, shared)
			if got := remaining(3, shared); got != 1 {
				t.Errorf("a second limiter of limit 3 under the first one's prefix: first call left %d, want 1 (shared state)", got)
			}
		})
	}
}
