// Package failsafe is what a limiter backed by a remote store (Redis, a
// daemon, a lease server) does when the store fails: a deadline per call,
// a failure policy that decides the calls the store could not (refuse,
// admit, or ask a local limiter), a circuit breaker that stops sending to
// a dead store, and events for each of them through the throttle.Observer
// hook. The backends of this module use its Policy; New wraps any other
// throttle.Limiter in all of it.
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
// context, or whose own deadline (earlier than the per-call timeout)
// passes, is not the store's failure either: its call counts for nothing
// and returns the context's error. Unless the store has answered no call
// at all for a whole per-call timeout: then such a call counts as a
// failure, so that a hanging store whose callers all have deadlines
// shorter than the timeout still opens the breaker (and their later calls
// go to the policy at once).
package failsafe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/breaker"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/deadline"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/optkit"
	"github.com/throttlekit/throttle/internal/report"
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
	defaultTimeout     = 100 * time.Millisecond
	defaultFailures    = 3
	defaultCooldown    = time.Second
	defaultMaxCooldown = time.Second
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
	throttle []throttle.Option
}

// WithPolicy sets the failure policy (default Closed).
func WithPolicy(p Policy) Option { return func(s *settings) { s.policy = p } }

// WithFallback sets the local limiter of the Fallback policy and selects
// that policy.
func WithFallback(l throttle.Limiter) Option {
	return func(s *settings) { s.fallback, s.policy = l, Fallback }
}

// WithTimeout bounds each call to the store (default 100ms); the
// earlier of it and the caller's deadline applies.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithBreaker opens the breaker after failures consecutive failures (0
// turns it off) for cooldown, doubled after each failed probe up to
// maxCooldown. Default: 3 failures, a cooldown of 1s, no doubling.
func WithBreaker(failures int, cooldown, maxCooldown time.Duration) Option {
	return func(s *settings) { s.failures, s.cooldown, s.maxCool = failures, cooldown, maxCooldown }
}

// WithObserver reports to o, under name, every call as throttle.Observe
// does (an EventDecision, or an EventError for a call that failed), and
// the wrapper's own events: the breaker opening and closing
// (EventBreakerOpen, EventBreakerClosed) and each call the policy decided
// because the store failed (EventFallback, with its decision and the
// store's error: a Closed refusal is a denied fallback, reported beside
// the call's EventError). o must not block. Nil turns it off.
func WithObserver(name string, o throttle.Observer) Option {
	return func(s *settings) { s.name, s.observer = name, o }
}

// WithOptions passes options of the throttle package: WithClock, the
// clock the breaker's cooldowns are measured on (default: the monotonic
// system clock). The options of keyed limiters (WithMaxKeys, ...) are
// rejected: the wrapper keeps no state per key.
func WithOptions(opts ...throttle.Option) Option {
	return func(s *settings) { s.throttle = append(s.throttle, opts...) }
}

// guard is the deadline, policy and breaker of one limiter made by New.
type guard struct {
	inner    throttle.Limiter
	next     limiterkit.Next // inner's methods, for the direct Allow's slow paths
	quota    func() throttle.Quota
	policy   Policy
	fallback throttle.Limiter
	report   report.To
	clk      clock.Source
	br       breaker.Breaker
	dl       deadline.Shared
	timeout  int64        // the per-call timeout, ns
	heard    atomic.Int64 // when the store last answered a call (g.clk), to within timeout/8
}

// ErrOpen is the store failure of a call the open breaker refused to
// send; it wraps throttle.ErrUnavailable.
var ErrOpen = fmt.Errorf("%w: circuit breaker open", throttle.ErrUnavailable)

// New wraps inner, a limiter backed by a store, in a deadline per call, a
// failure policy and a circuit breaker. The result is safe for concurrent
// use and keeps inner's abilities (limiterkit.Decorate): a Holder's units
// are held and released through it, a Reserver's bookings made, a
// QuotaAllower's limits passed and a Quota reported. The deadline bounds
// each call but Hold, which waits for capacity until the caller's context
// ends.
//
// Errors wrap throttle.ErrInvalid: a nil inner, an unknown policy, Fallback
// without a limiter, a non-positive timeout or a bad breaker.
func New(inner throttle.Limiter, opts ...Option) (throttle.Limiter, error) {
	s := settings{timeout: defaultTimeout, failures: defaultFailures, cooldown: defaultCooldown, maxCool: defaultMaxCooldown}
	if err := optkit.Apply(&s, "failsafe", opts); err != nil {
		return nil, err
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
	ts, err := limiterkit.NewSingleSettings(s.throttle...)
	if err != nil {
		return nil, fmt.Errorf("failsafe: %w", err)
	}
	g := &guard{inner: inner, policy: s.policy, fallback: s.fallback, clk: clock.New(ts.Clock),
		quota: func() throttle.Quota { return throttle.Quota{} }, report: report.New(s.name, s.observer)}
	if err := g.br.Init(s.failures, s.cooldown, s.maxCool); err != nil {
		return nil, err
	}
	g.dl.Init(s.timeout)
	g.timeout = int64(s.timeout)
	g.heard.Store(g.clk.Now())
	if q, ok := inner.(throttle.QuotaReporter); ok {
		g.quota = q.Quota
	}
	g.next = func(ctx context.Context, c limiterkit.Call) (limiterkit.Result, error) {
		return limiterkit.Invoke(ctx, inner, c)
	}
	l := limiterkit.Decorate(inner, g.call, g.allow)
	return throttle.Observe(l, s.name, s.observer), nil
}

// call asks the store within the deadline, unless the breaker is open;
// when the store fails, the policy decides.
func (g *guard) call(ctx context.Context, c limiterkit.Call, next limiterkit.Next) (limiterkit.Result, error) {
	if err := ctx.Err(); err != nil {
		return limiterkit.Result{}, err
	}
	probe, ok := g.br.Allow(g.clk.Now())
	return g.through(ctx, c, next, probe, ok)
}

// allow is call for an Allow, the path of every decision, without a
// Call's trip through the Decorator while the store is healthy.
func (g *guard) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if err := ctx.Err(); err != nil {
		return throttle.Decision{}, err
	}
	probe, ok := g.br.Allow(g.clk.Now())
	if !ok || probe {
		r, err := g.through(ctx, limiterkit.Call{Method: limiterkit.MethodAllow, Key: key, N: n}, g.next, probe, ok)
		return r.Decision, err
	}
	cctx, cancel := g.dl.With(ctx)
	d, err := g.inner.Allow(cctx, key, n)
	if cancel != nil {
		cancel()
	}
	failed, err := g.settle(ctx, cctx, err, false)
	if !failed {
		return d, err
	}
	r, err := g.decide(ctx, limiterkit.Call{Method: limiterkit.MethodAllow, Key: key, N: n}, err)
	return r.Decision, err
}

// through is call once the breaker has answered: ok, and probe when the
// call is its probe.
func (g *guard) through(ctx context.Context, c limiterkit.Call, next limiterkit.Next, probe, ok bool) (limiterkit.Result, error) {
	if !ok {
		return g.decide(ctx, c, ErrOpen)
	}
	cctx, cancel := ctx, context.CancelFunc(nil)
	if c.Method != limiterkit.MethodHold {
		cctx, cancel = g.dl.With(ctx)
	}
	r, err := g.ask(cctx, c, next, probe)
	if cancel != nil {
		cancel()
	}
	failed, err := g.settle(ctx, cctx, err, probe)
	if !failed {
		return r, err
	}
	return g.decide(ctx, c, err)
}

// settle tells the breaker how the store answered a call that returned
// err (ctx is the caller's context, cctx the call's) and returns the
// call's error, with failed true when the store failed: the error then
// wraps throttle.ErrUnavailable, and the policy decides the call.
func (g *guard) settle(ctx, cctx context.Context, err error, probe bool) (failed bool, _ error) {
	switch {
	case err == nil:
		g.success(probe)
		return false, nil
	case callerEnded(ctx, cctx):
		if g.silent() { // no caller heard from the store for a whole timeout
			g.failure(probe, fmt.Errorf("%w: no answer within any caller's deadline for %v", throttle.ErrUnavailable, time.Duration(g.timeout)))
		} else {
			g.br.Release(probe) // the caller gave up, or its own deadline passed: not the store's fault
		}
		return false, err
	case !errors.Is(err, throttle.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded):
		g.success(probe) // the store answered: this request's own error
		return false, err
	}
	if !errors.Is(err, throttle.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", throttle.ErrUnavailable, err)
	}
	g.failure(probe, err)
	return true, err
}

// failure counts a failure of the store, err, to the breaker.
func (g *guard) failure(probe bool, err error) {
	if g.br.Failure(g.clk.Now(), probe) {
		g.report.Event(throttle.Event{Kind: throttle.EventBreakerOpen, Err: err})
	}
}

// silent reports whether the store has answered no call for a whole
// per-call timeout: callers whose own deadlines are all shorter than the
// timeout then count as its failures.
func (g *guard) silent() bool { return g.clk.Now()-g.heard.Load() >= g.timeout }

// ask passes c on to the store. A probe that panics lets the next caller
// probe: it learned nothing of the store.
func (g *guard) ask(ctx context.Context, c limiterkit.Call, next limiterkit.Next, probe bool) (limiterkit.Result, error) {
	if probe {
		done := false
		defer func() {
			if !done {
				g.br.Release(true)
			}
		}()
		r, err := next(ctx, c)
		done = true
		return r, err
	}
	return next(ctx, c)
}

// callerEnded reports whether the call ended because of the caller's own
// context (cancelled, or its deadline, before the per-call timeout,
// passed) rather than the store. cctx is the call's context.
func callerEnded(ctx, cctx context.Context) bool {
	switch err := ctx.Err(); {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled):
		return true
	}
	mine, _ := ctx.Deadline()
	call, _ := cctx.Deadline()
	return !mine.After(call)
}

func (g *guard) success(probe bool) {
	if now := g.clk.Now(); now-g.heard.Load() >= g.timeout>>3 {
		g.heard.Store(now)
	}
	if g.br.Success(probe) {
		g.report.Event(throttle.Event{Kind: throttle.EventBreakerClosed})
	}
}

// decide applies the policy to a call the store failed with err.
func (g *guard) decide(ctx context.Context, c limiterkit.Call, err error) (limiterkit.Result, error) {
	var r limiterkit.Result
	switch g.policy {
	case Open:
		limit := g.quota().Limit
		if limit == 0 {
			limit = c.N
		}
		r.Decision = throttle.Decision{Allowed: true, Limit: limit, Remaining: max(limit-c.N, 0)}
		r.Reservation = throttle.Reservation{OK: true, Limit: limit}
	case Fallback:
		var ferr error
		if r, ferr = limiterkit.Invoke(ctx, g.fallback, c); ferr != nil {
			return r, ferr
		}
	default: // Closed: refused, with the store's error
		r.Decision.RetryAfter = g.br.RetryAfter(g.clk.Now())
	}
	g.report.Event(throttle.Event{Kind: throttle.EventFallback, Key: c.Key, N: c.N, Decision: r.Decision, Err: err})
	if g.policy == Closed {
		return r, err
	}
	return r, nil
}
