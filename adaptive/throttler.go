package adaptive

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

var _ throttle.Limiter = (*Throttler)(nil)

// ThrottlerConfig configures a Throttler. The zero value is the defaults.
type ThrottlerConfig struct {
	// K is how many requests per accepted one the backend may be sent
	// before the client starts dropping: 2 (the default) lets through
	// twice what the backend accepts, so a recovering backend is noticed.
	K float64
	// Window is the span of the sliding window the requests and accepts
	// are counted over (default 2 minutes); it slides in steps of
	// Window/16.
	Window time.Duration
	// Rand returns a uniform number in [0, 1); it must be safe for
	// concurrent use. Default: math/rand/v2's Float64.
	Rand func() float64
	// Accepted tells whether an error returned by a call made through
	// Throttled means the backend accepted it; default: OutcomeOf(err)
	// is not Dropped.
	Accepted func(error) bool
}

// Buckets of a Throttler's window. Each bucket is one word: the bucket's
// slot number (time / bucket width, truncated), the requests and the
// accepts, saturating.
const (
	buckets   = 16
	countBits = 21
	countMax  = 1<<countBits - 1
	slotShift = 2 * countBits
)

// Throttler is client-side adaptive throttling (Google SRE book,
// "Handling Overload"): it counts the requests a client makes and the
// ones the backend accepts over a sliding window, and drops a request
// locally with probability max(0, (requests − K·accepts) / (requests +
// 1)). Dropped requests count as requests, so a backend that rejects
// nearly everything sees about K times what it accepts.
//
// Allow counts a request and decides; Accept counts an accept, when the
// backend answered with anything but an overload refusal. It is safe for
// concurrent use by multiple goroutines, lock-free, and allocates
// nothing. The zero value is not usable; create one with NewThrottler.
//
// The window is 16 buckets of time. If an injected clock steps back, the
// buckets it left are not counted until it comes back to them, and the
// Throttler drops less meanwhile; a step forward empties the window.
// Either way it counts afresh from there.
type Throttler struct {
	b        [buckets]atomic.Uint64
	width    int64 // ns per bucket
	k        float64
	rand     func() float64
	accepted func(error) bool
	clock    clock.Source
}

// NewThrottler returns a Throttler. Of opts only throttle.WithClock
// applies. Errors wrap throttle.ErrInvalid.
func NewThrottler(c ThrottlerConfig, opts ...throttle.Option) (*Throttler, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	if c.K == 0 {
		c.K = 2
	}
	if c.Window == 0 {
		c.Window = 2 * time.Minute
	}
	if !(c.K >= 1) || c.Window < buckets {
		return nil, fmt.Errorf("%w: adaptive: ThrottlerConfig K %v (want >= 1), Window %v (want >= %dns)",
			throttle.ErrInvalid, c.K, c.Window, buckets)
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Accepted == nil {
		c.Accepted = func(err error) bool { return OutcomeOf(err) != Dropped }
	}
	return &Throttler{width: int64(c.Window) / buckets, k: c.K, rand: c.Rand, accepted: c.Accepted, clock: clock.New(s.Clock)}, nil
}

// counts sums the window's buckets at now.
func (t *Throttler) counts(now int64) (requests, accepts float64) {
	slot := uint64(now / t.width)
	for i := range uint64(buckets) {
		s := slot - i
		if w := t.b[s%buckets].Load(); w>>slotShift == s&(1<<(64-slotShift)-1) {
			requests += float64(w >> countBits & countMax)
			accepts += float64(w & countMax)
		}
	}
	return requests, accepts
}

// add counts requests and accepts in the bucket of now.
func (t *Throttler) add(now int64, requests, accepts uint64) {
	slot := uint64(now / t.width)
	tag := slot & (1<<(64-slotShift) - 1)
	b := &t.b[slot%buckets]
	for {
		w := b.Load()
		var r, a uint64
		if w>>slotShift == tag {
			r, a = w>>countBits&countMax, w&countMax
		}
		r, a = min(r+requests, countMax), min(a+accepts, countMax)
		if b.CompareAndSwap(w, tag<<slotShift|r<<countBits|a) {
			return
		}
	}
}

// DropProbability returns the probability with which Allow drops a
// request now.
func (t *Throttler) DropProbability() float64 {
	return t.p(t.counts(t.clock.Now()))
}

func (t *Throttler) p(requests, accepts float64) float64 {
	return max(0, (requests-t.k*accepts)/(requests+1))
}

// Allow counts n requests and drops them (Allowed false) with the drop
// probability. Decision.Limit is K times the accepts in the window and
// Remaining how many more requests fit under it before drops begin. The
// key is ignored. Errors wrap throttle.ErrInvalid (n <= 0).
func (t *Throttler) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	if n <= 0 {
		return d, limiterkit.CheckN(n, n)
	}
	now := t.clock.Now()
	req, acc := t.counts(now)
	p := t.p(req, acc)
	allowed := p == 0 || t.rand() >= p
	t.add(now, uint64(n), 0)
	lim := t.k * acc
	limiterkit.Fill(&d, allowed, int64(lim), int64(max(lim-req-float64(n), 0)), 0, 0)
	return d, nil
}

// done counts the outcome of one request Allow let through, from its
// error: withdrawn when it was not sent (NotSent), an accept when
// ThrottlerConfig.Accepted says so, else nothing (a rejection).
func (t *Throttler) done(err error) {
	switch {
	case NotSent(err):
		t.Withdraw(1)
	case t.accepted(err):
		t.Accept(1)
	}
}

// Accept counts n requests the backend accepted: it answered with
// anything but a refusal for overload (a 429, a 503,
// RESOURCE_EXHAUSTED) or a timeout.
func (t *Throttler) Accept(n int) {
	if n > 0 {
		t.add(t.clock.Now(), 0, uint64(n))
	}
}

// Withdraw uncounts n requests that Allow counted and let through but
// that never reached the backend (NotSent: a limiter behind the Throttler
// refused them): they count neither as requests nor as rejections. They
// are taken from the newest buckets of the window that hold requests. It
// is lock-free and allocates nothing.
func (t *Throttler) Withdraw(n int) {
	if n <= 0 {
		return
	}
	slot, left := uint64(t.clock.Now()/t.width), uint64(n)
	for i := uint64(0); i < buckets && left > 0; i++ {
		s := slot - i
		tag := s & (1<<(64-slotShift) - 1)
		b := &t.b[s%buckets]
		for {
			w := b.Load()
			r := w >> countBits & countMax
			if w>>slotShift != tag || r == 0 {
				break
			}
			take := min(r, left)
			if b.CompareAndSwap(w, tag<<slotShift|(r-take)<<countBits|w&countMax) {
				left -= take
				break
			}
		}
	}
}

// Throttled returns f throttled by t: a call t drops returns the zero T
// and a *throttle.LimitedError (errors.Is(err, throttle.ErrLimited))
// without running f; a call whose error says it was not sent (NotSent) is
// withdrawn; a call that runs counts as accepted when
// ThrottlerConfig.Accepted says so of its error. The returned function is
// safe for concurrent use if f is.
func Throttled[T any](t *Throttler, key string, f func(context.Context) (T, error)) func(context.Context) (T, error) {
	return func(ctx context.Context) (T, error) {
		d, err := t.Allow(ctx, key, 1)
		if err != nil || !d.Allowed {
			var zero T
			if err == nil {
				err = &throttle.LimitedError{Key: key, Decision: d}
			}
			return zero, err
		}
		v, err := f(ctx)
		t.done(err)
		return v, err
	}
}
