// Package failsafe is what a limiter backed by a remote store (Redis, a
// daemon, a lease server) does when the store fails: a deadline per call,
// a failure policy that decides the calls the store could not (refuse,
// admit, or ask a local limiter), a circuit breaker that stops sending to
// a dead store, and events for each of them through the throttle.Observer
// hook. The backends of this module use its Breaker; Limiter wraps any
// other throttle.Limiter in all of it.
//
//	l, err := failsafe.New(storeLimiter,
//		failsafe.WithTimeout(50*time.Millisecond),
//		failsafe.WithFallback(localShare), // or WithPolicy(failsafe.Open)
//		failsafe.WithBreaker(3, time.Second, 8*time.Second))
//
// Only failures of the store count: an error wrapping
// throttle.ErrUnavailable, or the per-call deadline passing. Errors of a
// request itself (a bad key, n above the limit, a key holding bad data:
// throttle.ErrInvalid, ErrExceedsLimit) pass through untouched, count for
// nothing and are never decided by the policy; a caller that cancels its
// context is not the store's failure either.
package failsafe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
)

// Policy decides the requests a store could not.
type Policy int

// Policies.
const (
	// Closed refuses: the Decision is denied and the error wraps
	// throttle.ErrUnavailable. The default.
	Closed Policy = iota
	// Open admits, and reports the admission as a fallback.
	Open
	// Fallback asks the local limiter given with WithFallback.
	Fallback
)

// String returns the policy's name.
func (p Policy) String() string {
	switch p {
	case Closed:
		return "Closed"
	case Open:
		return "Open"
	case Fallback:
		return "Fallback"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Defaults of Limiter.
const (
	DefaultTimeout     = 100 * time.Millisecond
	DefaultFailures    = 3
	DefaultCooldown    = time.Second
	DefaultMaxCooldown = time.Second
)

// Option configures a Limiter.
type Option func(*settings)

type settings struct {
	policy   Policy
	fallback throttle.Limiter
	timeout  time.Duration
	failures int
	cooldown time.Duration
	maxCool  time.Duration
	name     string
	observer throttle.Observer
	clock    throttle.Clock
}

// WithPolicy sets the failure policy (default Closed).
func WithPolicy(p Policy) Option { return func(s *settings) { s.policy = p } }

// WithFallback sets the local limiter of the Fallback policy and selects
// that policy.
func WithFallback(l throttle.Limiter) Option {
	return func(s *settings) { s.fallback, s.policy = l, Fallback }
}

// WithTimeout bounds each call to the store (default DefaultTimeout); the
// earlier of it and the caller's deadline applies.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithBreaker opens the breaker after failures consecutive failures (0
// turns it off) for cooldown, doubled after each failed probe up to
// maxCooldown. Default: DefaultFailures, DefaultCooldown,
// DefaultMaxCooldown.
func WithBreaker(failures int, cooldown, maxCooldown time.Duration) Option {
	return func(s *settings) { s.failures, s.cooldown, s.maxCool = failures, cooldown, maxCooldown }
}

// WithObserver reports, under name, the breaker opening and closing and
// each request the policy decided (EventFallback, with its decision and
// the store's error). o must not block.
func WithObserver(name string, o throttle.Observer) Option {
	return func(s *settings) { s.name, s.observer = name, o }
}

// WithClock sets the clock the breaker's cooldowns are measured on
// (default: the monotonic system clock).
func WithClock(c throttle.Clock) Option { return func(s *settings) { s.clock = c } }

// Limiter wraps a limiter backed by a store in a deadline per call, a
// failure policy and a circuit breaker. It is safe for concurrent use;
// create it with New. It passes Quota through when the inner limiter
// reports one.
type Limiter struct {
	inner    throttle.Limiter
	policy   Policy
	fallback throttle.Limiter
	timeout  time.Duration
	name     string
	observer throttle.Observer
	clk      clock.Source
	br       Breaker
	dl       Deadlines
}

var (
	_ throttle.Limiter       = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
)

// ErrOpen is the store failure of a call the open breaker refused to
// send; it wraps throttle.ErrUnavailable.
var ErrOpen = fmt.Errorf("%w: circuit breaker open", throttle.ErrUnavailable)

// New wraps inner. Errors wrap throttle.ErrInvalid: a nil inner, an
// unknown policy, Fallback without a limiter, a non-positive timeout or a
// bad breaker.
func New(inner throttle.Limiter, opts ...Option) (*Limiter, error) {
	s := settings{timeout: DefaultTimeout, failures: DefaultFailures, cooldown: DefaultCooldown, maxCool: DefaultMaxCooldown}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil failsafe Option", throttle.ErrInvalid)
		}
		o(&s)
	}
	switch {
	case inner == nil:
		return nil, fmt.Errorf("%w: failsafe: nil limiter", throttle.ErrInvalid)
	case s.policy < Closed || s.policy > Fallback:
		return nil, fmt.Errorf("%w: failsafe: unknown %v", throttle.ErrInvalid, s.policy)
	case s.policy == Fallback && s.fallback == nil:
		return nil, fmt.Errorf("%w: failsafe: the Fallback policy needs a limiter (WithFallback)", throttle.ErrInvalid)
	case s.timeout <= 0:
		return nil, fmt.Errorf("%w: failsafe: timeout %v must be positive", throttle.ErrInvalid, s.timeout)
	}
	l := &Limiter{inner: inner, policy: s.policy, fallback: s.fallback, timeout: s.timeout,
		name: s.name, observer: s.observer, clk: clock.New(s.clock)}
	if err := l.br.Init(s.failures, s.cooldown, s.maxCool); err != nil {
		return nil, err
	}
	l.dl.Init(s.timeout)
	return l, nil
}

// Allow asks the inner limiter within the deadline, unless the breaker is
// open; when the store fails, the policy decides.
func (l *Limiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if err := ctx.Err(); err != nil {
		return throttle.Decision{}, err
	}
	probe, ok := l.br.Allow(l.clk.Now())
	if !ok {
		return l.decide(ctx, key, n, ErrOpen)
	}
	cctx, cancel := l.dl.With(ctx)
	d, err := l.inner.Allow(cctx, key, n)
	if cancel != nil {
		cancel()
	}
	switch {
	case err == nil:
		l.success(probe)
		return d, nil
	case errors.Is(ctx.Err(), context.Canceled):
		l.br.Release(probe) // the caller gave up: not the store's fault
		return d, err
	case !errors.Is(err, throttle.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded):
		l.success(probe) // the store answered: this request's own error
		return d, err
	}
	if !errors.Is(err, throttle.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", throttle.ErrUnavailable, err)
	}
	if l.br.Failure(l.clk.Now(), probe) {
		l.observe(throttle.Event{Kind: throttle.EventBreakerOpen, Err: err})
	}
	return l.decide(ctx, key, n, err)
}

func (l *Limiter) success(probe bool) {
	if l.br.Success(probe) {
		l.observe(throttle.Event{Kind: throttle.EventBreakerClosed})
	}
}

// decide applies the policy to a request the store failed with err.
func (l *Limiter) decide(ctx context.Context, key string, n int, err error) (throttle.Decision, error) {
	var d throttle.Decision
	switch l.policy {
	case Open:
		d = throttle.Decision{Allowed: true, Limit: n, Remaining: 0}
		if q, ok := l.inner.(throttle.QuotaReporter); ok {
			d.Limit = q.Quota().Limit
			d.Remaining = max(d.Limit-n, 0)
		}
	case Fallback:
		var ferr error
		if d, ferr = l.fallback.Allow(ctx, key, n); ferr != nil {
			return d, ferr
		}
	default:
		return throttle.Decision{RetryAfter: l.br.RetryAfter(l.clk.Now())}, err
	}
	l.observe(throttle.Event{Kind: throttle.EventFallback, Key: key, N: n, Decision: d, Err: err})
	return d, nil
}

func (l *Limiter) observe(e throttle.Event) {
	if l.observer != nil {
		e.Limiter = l.name
		l.observer.Observe(e)
	}
}

// Quota reports the inner limiter's quota (zero when it states none).
func (l *Limiter) Quota() throttle.Quota {
	if q, ok := l.inner.(throttle.QuotaReporter); ok {
		return q.Quota()
	}
	return throttle.Quota{}
}

// Breaker returns the limiter's breaker, to inspect.
func (l *Limiter) Breaker() *Breaker { return &l.br }
