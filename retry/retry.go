// Package retry retries failed calls without multiplying load in an
// outage: exponential back-off with full jitter, a cap on attempts, the
// server's Retry-After honoured up to a bound, and a Budget shared by all
// the callers of a client (gRPC's retry throttling: failures cost a
// token, successes earn a fraction of one, and retries stop while fewer
// than half the tokens are left).
//
// Do retries a function; httplimit.RetryTransport retries HTTP requests,
// idempotent ones only unless told otherwise. A Policy and a Budget are
// safe for concurrent use; share one of each among the callers of one
// backend.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/unsent"
)

// Defaults of a Policy.
const (
	defaultMaxAttempts   = 3
	defaultBaseDelay     = 100 * time.Millisecond
	defaultMaxDelay      = 10 * time.Second
	defaultMaxRetryAfter = 30 * time.Second
)

// Policy says which failures are retried and when. The zero value is the
// defaults, with no Budget, and so is a nil *Policy. A Policy must not be
// changed once in use.
type Policy struct {
	// MaxAttempts caps the attempts, the first included (default 3).
	MaxAttempts int
	// BaseDelay and MaxDelay shape the back-off before retry i (1 for the
	// first): a uniform draw from [0, min(MaxDelay, BaseDelay·2^(i−1)))
	// ("full jitter"). Defaults 100ms and 10s.
	BaseDelay, MaxDelay time.Duration
	// MaxRetryAfter bounds the wait a server may ask for (Retry-After, or
	// a throttle.LimitedError's RetryAfter): a longer one is not waited
	// for, and the failure is returned (default 30s).
	MaxRetryAfter time.Duration
	// Budget, if not nil, must grant every retry; share it among the
	// callers of one backend.
	Budget *Budget
	// Retryable tells whether an error of Do's function may be retried;
	// default: it wraps throttle.ErrLimited or throttle.ErrUnavailable.
	Retryable func(error) bool
	// Rand returns a uniform number in [0, 1), safe for concurrent use;
	// default math/rand/v2's Float64.
	Rand func() float64
	// Name and Observer, when Observer is set, report every retryable
	// failure as a throttle.EventRetry.
	Name     string
	Observer throttle.Observer
}

// Backoff returns the jittered delay before retry i (1 for the first).
func (p *Policy) Backoff(i int) time.Duration {
	if p == nil {
		p = &zero
	}
	base, ceil := orDefault(p.BaseDelay, defaultBaseDelay), orDefault(p.MaxDelay, defaultMaxDelay)
	d := ceil
	if i >= 1 && i < 63 && base <= ceil>>(i-1) {
		d = min(ceil, base<<(i-1))
	}
	return time.Duration(p.rand() * float64(d))
}

// Next is told that attempt (1 for the first) failed in a way worth
// retrying, the server asking for a wait of retryAfter (0 if it did
// not), and says whether to retry and after how long: not past
// MaxAttempts, not when retryAfter is above MaxRetryAfter, and not when
// the Budget refuses. It charges the failure to the Budget. The delay is
// the back-off, or retryAfter spread by up to a fifth more
// (retryAfter·(1 + U[0, 0.2)), at most MaxRetryAfter) when that is
// longer: never earlier than the server asked, and the clients it refused
// together do not all come back at the same instant.
func (p *Policy) Next(attempt int, retryAfter time.Duration) (delay time.Duration, ok bool) {
	return p.next(attempt, retryAfter, true, math.MaxInt64)
}

// NextCall is Next for a call under ctx that failed with err: a failure
// that never reached the backend (err wraps throttle.ErrLimited or
// adaptive.ErrNotSent: a local limiter refused it) is not charged to the
// Budget, and a retry whose delay would end after ctx's deadline is
// refused (ok false), so the caller gets the backend's answer rather
// than a deadline error.
func (p *Policy) NextCall(ctx context.Context, attempt int, retryAfter time.Duration, err error) (delay time.Duration, ok bool) {
	left := time.Duration(math.MaxInt64)
	if dl, has := ctx.Deadline(); has {
		left = time.Until(dl)
	}
	return p.next(attempt, retryAfter, !unsent.Is(err), left)
}

func (p *Policy) next(attempt int, retryAfter time.Duration, charge bool, left time.Duration) (delay time.Duration, ok bool) {
	if p == nil {
		p = &zero
	}
	maxAttempts, maxAfter := orDefault(p.MaxAttempts, defaultMaxAttempts), orDefault(p.MaxRetryAfter, defaultMaxRetryAfter)
	ok = (!charge || p.Budget.fail()) && attempt < maxAttempts && retryAfter <= maxAfter
	if ok {
		spread := min(retryAfter+time.Duration(p.rand()*0.2*float64(retryAfter)), max(maxAfter, retryAfter))
		delay = max(p.Backoff(attempt), spread)
		ok = delay <= left
	}
	if p.Observer != nil {
		p.Observer.Observe(throttle.Event{Kind: throttle.EventRetry, Limiter: p.Name, N: attempt,
			Decision: throttle.Decision{Allowed: ok, RetryAfter: delay}})
	}
	return delay, ok
}

func (p *Policy) rand() float64 {
	if p.Rand != nil {
		return p.Rand()
	}
	return rand.Float64()
}

// Succeeded tells the Budget that an attempt succeeded.
func (p *Policy) Succeeded() {
	if p != nil {
		p.Budget.succeed()
	}
}

var zero Policy

// orDefault returns v, or def when v is not positive (unset).
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Do calls f until it succeeds, fails in a way Retryable says not to
// retry, or Next refuses a retry; it waits the back-off between attempts
// and returns the last result. An error's Retry-After is the RetryAfter
// of a *throttle.LimitedError it wraps. The caller vouches that f is safe
// to repeat (idempotent). A back-off that would end past ctx's deadline
// is not started: the last failure is returned (see NextCall). Do returns
// early, with an error wrapping ctx.Err() and the last failure, when ctx
// ends during a back-off.
func Do[T any](ctx context.Context, p *Policy, f func(context.Context) (T, error)) (T, error) {
	if p == nil {
		p = &zero
	}
	retryable := p.Retryable
	if retryable == nil {
		retryable = func(err error) bool {
			return errors.Is(err, throttle.ErrLimited) || errors.Is(err, throttle.ErrUnavailable)
		}
	}
	for attempt := 1; ; attempt++ {
		v, err := f(ctx)
		if err == nil {
			p.Succeeded()
			return v, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return v, err
		}
		var hint time.Duration
		if le := (*throttle.LimitedError)(nil); errors.As(err, &le) {
			hint = le.Decision.RetryAfter
		}
		delay, ok := p.NextCall(ctx, attempt, hint, err)
		if !ok {
			return v, err
		}
		if werr := Sleep(ctx, delay); werr != nil {
			return v, fmt.Errorf("retry: %w while backing off after: %w", werr, err)
		}
	}
}

// Sleep waits d or until ctx ends, and then returns ctx.Err().
func Sleep(ctx context.Context, d time.Duration) error { return clock.Sleep(ctx, d) }

// Budget is a retry budget shared by the callers of one backend, as
// gRPC's retry throttling: it holds up to max tokens, starting full; a
// failed attempt takes one, a successful one gives back ratio, and a
// retry is granted only while more than max/2 tokens are left. So, in an
// outage, retries stop after about max/2 failures and then add at most
// ratio retries per success. It is safe for concurrent use and lock-free.
// A nil *Budget grants every retry.
type Budget struct {
	milli      atomic.Int64 // tokens, in thousandths
	max, ratio int64
}

// NewBudget returns a full Budget of maxTokens (in [1, 1e6]) earning
// ratio (in [0.001, 1]; kept to thousandths) of a token per success.
// Errors wrap throttle.ErrInvalid.
func NewBudget(maxTokens int, ratio float64) (*Budget, error) {
	if maxTokens < 1 || maxTokens > 1e6 || !(ratio >= 0.001 && ratio <= 1) {
		return nil, fmt.Errorf("%w: retry: NewBudget(%d, %v): want maxTokens in [1, 1e6], ratio in [0.001, 1]", throttle.ErrInvalid, maxTokens, ratio)
	}
	b := &Budget{max: int64(maxTokens) * 1000, ratio: int64(ratio*1000 + 0.5)}
	b.milli.Store(b.max)
	return b, nil
}

// Tokens returns the tokens left.
func (b *Budget) Tokens() float64 { return float64(b.milli.Load()) / 1000 }

// fail takes a token and reports whether a retry is granted.
func (b *Budget) fail() bool {
	if b == nil {
		return true
	}
	for {
		v := b.milli.Load()
		n := max(v-1000, 0)
		if b.milli.CompareAndSwap(v, n) {
			return n > b.max/2
		}
	}
}

// succeed gives back ratio of a token.
func (b *Budget) succeed() {
	if b == nil {
		return
	}
	for {
		v := b.milli.Load()
		if v >= b.max || b.milli.CompareAndSwap(v, min(v+b.ratio, b.max)) {
			return
		}
	}
}
