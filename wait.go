package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/throttlekit/throttle/internal/clock"
)

// WaitOption configures Wait, and Wrap, which waits as Wait does when
// given Blocking. KeyFrom and Blocking are Wrap's alone: Wait
// refuses them with an error wrapping ErrInvalid.
type WaitOption func(*waitConfig)

type waitConfig struct {
	maxWait    time.Duration
	jitter     float64
	maxBackoff time.Duration
	// Wrap's options.
	key    func(context.Context) string
	wait   bool
	wrapOp string // the name of the last option only Wrap takes
}

// newWaitConfig returns the defaults with opts applied.
func newWaitConfig(opts []WaitOption) waitConfig {
	c := waitConfig{maxWait: defaultMaxWait, jitter: defaultJitter, maxBackoff: defaultMaxBackoff}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// check validates the options Wait uses.
func (c *waitConfig) check() error {
	if c.maxWait < 0 || c.jitter < 0 || c.jitter > 1 || c.jitter != c.jitter {
		return fmt.Errorf("%w: Wait options: MaxWait %v, Jitter %v", ErrInvalid, c.maxWait, c.jitter)
	}
	return nil
}

// Defaults of Wait.
const (
	// defaultMaxWait bounds how far ahead Wait books capacity when the
	// context has no deadline: a minute.
	defaultMaxWait = time.Minute
	// defaultJitter is the fraction of a back-off added at random.
	defaultJitter = 0.2
	// defaultMaxBackoff caps the back-off when the limiter gives no
	// RetryAfter (capacity freed by release, not by time).
	defaultMaxBackoff = time.Second
)

// MaxWait bounds how far ahead Wait may book capacity on a Reserver (the
// "max reserved permits" bound, as time). Past it Wait backs off and
// tries again. Default: a minute, or less if ctx has a deadline.
// MaxWait(0) books nothing ahead: Wait then asks Allow and retries after
// each RetryAfter plus jitter, as on a limiter that cannot reserve, at the
// cost of fairness between waiters.
func MaxWait(d time.Duration) WaitOption { return func(c *waitConfig) { c.maxWait = d } }

// withJitter sets the fraction (0 to 1) of each back-off that is added at
// random, so that waiters denied together do not retry together (default
// 0.2; tests set it through export_test.go).
func withJitter(f float64) WaitOption { return func(c *waitConfig) { c.jitter = f } }

// Wait blocks until l admits n units for key, ctx is done, or l fails.
//
// If l implements Reserver (and MaxWait is not 0), Wait books the
// earliest slot within MaxWait and sleeps until it: waiters are served in
// arrival order and only one wake-up happens per slot. If the slot is
// further than MaxWait, or l cannot reserve, Wait sleeps for the
// RetryAfter it was given plus up to 20 % at random and tries again. It returns at once,
// with an error wrapping ErrExceedsLimit, when n can never be admitted,
// and an error wrapping ctx.Err() (or context.DeadlineExceeded, when the
// deadline is too near to be met) when ctx ends first; booked capacity is
// then given back.
func Wait(ctx context.Context, l Limiter, key string, n int, opts ...WaitOption) error {
	c := newWaitConfig(opts)
	if c.wrapOp != "" {
		return fmt.Errorf("%w: %s is an option of Wrap, not of Wait", ErrInvalid, c.wrapOp)
	}
	if err := c.check(); err != nil {
		return err
	}
	return c.run(ctx, l, key, n)
}

// run is Wait with the options checked.
func (c *waitConfig) run(ctx context.Context, l Limiter, key string, n int) error {
	r, canReserve := l.(Reserver)
	canReserve = canReserve && c.maxWait > 0
	backoff := time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var retry time.Duration
		var done bool
		var err error
		if canReserve {
			retry, done, err = waitReserved(ctx, r, key, n, c.maxWait)
		} else {
			retry, done, err = tryAllow(ctx, l, key, n)
		}
		if done || err != nil {
			return err
		}
		if retry, err = c.pause(ctx, key, retry, &backoff); err != nil {
			return err
		}
		if err := clock.Sleep(ctx, retry+jitter(retry, c.jitter)); err != nil {
			return err
		}
	}
}

// waitReserved books n units for key on r within maxWait (less if ctx's
// deadline is nearer) and sleeps until they are due: done once they are.
// Otherwise retry is how long until the first free slot.
func waitReserved(ctx context.Context, r Reserver, key string, n int, maxWait time.Duration) (retry time.Duration, done bool, err error) {
	byDeadline := false
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < maxWait {
		maxWait, byDeadline = max(time.Until(dl), 0), true
	}
	res, err := r.Reserve(ctx, key, n, maxWait)
	if err != nil {
		return 0, true, err
	}
	if res.OK {
		if err := clock.Sleep(ctx, res.Delay); err != nil {
			res.Cancel()
			return 0, true, err
		}
		return 0, true, nil
	}
	if byDeadline { // the first free slot is past the deadline
		return 0, true, fmt.Errorf("throttle: wait for %q needs more than %v, beyond the deadline: %w", key, maxWait, context.DeadlineExceeded)
	}
	return res.Delay, false, nil
}

// tryAllow asks l for n units of key: done if admitted, else retry is
// the RetryAfter of the denial.
func tryAllow(ctx context.Context, l Limiter, key string, n int) (retry time.Duration, done bool, err error) {
	d, err := l.Allow(ctx, key, n)
	if err != nil || d.Allowed {
		return 0, true, err
	}
	return d.RetryAfter, false, nil
}

// pause is how long Wait sleeps, before jitter, when told to retry after
// retry: that, or when retry is 0 (units freed by release, not by time)
// the next step of an exponential back-off, never past half the time
// left to ctx's deadline. It fails when retry is past the deadline.
func (c *waitConfig) pause(ctx context.Context, key string, retry time.Duration, backoff *time.Duration) (time.Duration, error) {
	byRelease := retry <= 0
	if byRelease {
		retry = *backoff
		*backoff = min(2**backoff, c.maxBackoff)
	}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		switch {
		case byRelease:
			// Capacity may come back at any moment: never let one
			// back-off step use up the time left.
			retry = min(retry, max(left/2, time.Millisecond))
		case left < retry:
			return 0, fmt.Errorf("throttle: wait for %q needs %v, beyond the deadline: %w", key, retry, context.DeadlineExceeded)
		}
	}
	return retry, nil
}

func jitter(d time.Duration, f float64) time.Duration {
	if f == 0 || d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(float64(d)*f) + 1))
}
