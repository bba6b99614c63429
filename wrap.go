package throttle

import (
	"context"
	"fmt"
)

// WrapOption configures Wrap.
type WrapOption func(*wrapConfig)

type wrapConfig struct {
	key      func(context.Context) string
	cost     int
	wait     bool
	waitOpts []WaitOption
}

// KeyFrom makes the wrapped function take its key from the context of
// each call (a client id, an IP) instead of the fixed key given to Wrap.
func KeyFrom(f func(context.Context) string) WrapOption {
	return func(c *wrapConfig) { c.key = f }
}

// Cost charges n units per call instead of 1.
func Cost(n int) WrapOption { return func(c *wrapConfig) { c.cost = n } }

// Blocking makes the wrapped function wait for capacity (see Wait, which
// receives opts) instead of failing with ErrLimited.
func Blocking(opts ...WaitOption) WrapOption {
	return func(c *wrapConfig) { c.wait, c.waitOpts = true, opts }
}

// LimitedError is returned by a wrapped function whose call was throttled.
// It wraps ErrLimited and carries the limiter's Decision.
type LimitedError struct {
	Key      string
	Decision Decision
}

// Error says which key was limited and when to retry.
func (e *LimitedError) Error() string {
	return fmt.Sprintf("throttle: %q rate limited, retry after %v", e.Key, e.Decision.RetryAfter)
}

// Unwrap returns ErrLimited.
func (e *LimitedError) Unwrap() error { return ErrLimited }

// Wrap returns f throttled by l: each call first asks l for Cost units
// (default 1) under key. When denied, the call returns the zero T and a
// *LimitedError (errors.Is(err, ErrLimited)); with Blocking it waits for
// capacity instead. Errors from l are returned as they are and f is not
// run. When l is a Holder (a concurrency limit), the units are held while f
// runs and given back when it returns or panics. The returned function is
// safe for concurrent use if l and f are.
func Wrap[T any](l Limiter, key string, f func(context.Context) (T, error), opts ...WrapOption) func(context.Context) (T, error) {
	c := wrapConfig{cost: 1, key: func(context.Context) string { return key }}
	for _, o := range opts {
		o(&c)
	}
	return func(ctx context.Context) (T, error) {
		var zero T
		k := c.key(ctx)
		if c.wait {
			if h, ok := l.(Holder); ok {
				release, err := h.Hold(ctx, k, c.cost)
				if err != nil {
					return zero, err
				}
				defer release()
				return f(ctx)
			}
			if err := Wait(ctx, l, k, c.cost, c.waitOpts...); err != nil {
				return zero, err
			}
			return f(ctx)
		}
		d, release, err := TryHold(ctx, l, k, c.cost)
		if err != nil {
			return zero, err
		}
		defer release()
		if !d.Allowed {
			return zero, &LimitedError{Key: k, Decision: d}
		}
		return f(ctx)
	}
}
