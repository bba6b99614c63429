package throttle

import (
	"context"
	"fmt"
)

// KeyFrom makes the wrapped function take its key from the context of
// each call (a client id, an IP) instead of the fixed key given to Wrap.
// An option of Wrap only.
func KeyFrom(f func(context.Context) string) WaitOption {
	return func(c *waitConfig) { c.key, c.wrapOp = f, "KeyFrom" }
}

// Blocking makes the wrapped function wait for capacity, as Wait does with
// the other options given to Wrap, instead of failing with ErrLimited. An
// option of Wrap only.
func Blocking() WaitOption { return func(c *waitConfig) { c.wait, c.wrapOp = true, "Blocking" } }

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

// Wrap returns f throttled by l: each call first asks l for one unit
// under key (Wait and TryHold take other amounts). When denied, the call returns the zero T and a
// *LimitedError (errors.Is(err, ErrLimited)); with Blocking it waits for
// capacity instead (an invalid MaxWait or jitter then fails each call
// with ErrInvalid). Errors from l are returned as they are and f is not
// run. When l is a Holder (a concurrency limit), the units are held while f
// runs and given back when it returns or panics. The returned function is
// safe for concurrent use if l and f are.
func Wrap[T any](l Limiter, key string, f func(context.Context) (T, error), opts ...WaitOption) func(context.Context) (T, error) {
	c := newWaitConfig(opts)
	if c.key == nil {
		c.key = func(context.Context) string { return key }
	}
	return func(ctx context.Context) (T, error) {
		var zero T
		k := c.key(ctx)
		if c.wait {
			if h, ok := l.(Holder); ok {
				release, err := h.Hold(ctx, k, 1)
				if err != nil {
					return zero, err
				}
				defer release()
				return f(ctx)
			}
			if err := c.check(); err != nil {
				return zero, err
			}
			if err := c.run(ctx, l, k, 1); err != nil {
				return zero, err
			}
			return f(ctx)
		}
		d, release, err := TryHold(ctx, l, k, 1)
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
