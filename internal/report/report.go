// Package report is how a limiter that takes an observer (a WithObserver
// option) reports its calls and its own events: the Events throttle.Observe
// would report for the same calls, so that every limiter counts its
// decisions the same way.
package report

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/bridge"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// To reports to an Observer under a name. The zero value reports nothing;
// a To is immutable, so its methods are safe for concurrent use when the
// Observer is.
type To struct {
	name  string
	o     throttle.Observer
	timed bool
}

// New returns a To reporting to o under name; a nil o reports nothing.
func New(name string, o throttle.Observer) To {
	return To{name: name, o: o, timed: bridge.ObservesLatency(o)}
}

// On reports whether there is an Observer.
func (r *To) On() bool { return r.o != nil }

// Start returns the instant a call starts, for Call to time it: the zero
// Time unless the Observer asks for latency (see throttle.Observer).
func (r *To) Start() time.Time {
	if r.timed {
		return time.Now()
	}
	return time.Time{}
}

// Call reports a call of method m for n units of key that returned d and
// err: an EventDecision, or an EventError when err is not nil. start is
// what Start returned before the call.
func (r *To) Call(m limiterkit.Method, key string, n int, d throttle.Decision, err error, start time.Time) {
	if r.o == nil {
		return
	}
	e := throttle.Event{Kind: throttle.EventDecision, Limiter: r.name, Key: key, N: n, Decision: d, Err: err, Held: err == nil && d.Allowed && m.Holds()}
	if err != nil {
		e.Kind = throttle.EventError
	}
	if !start.IsZero() {
		e.Latency = time.Since(start)
	}
	r.o.Observe(e)
}

// Decide makes decide(ctx, key, n), a call of method m, and reports it.
func (r *To) Decide(ctx context.Context, m limiterkit.Method, key string, n int, decide func(context.Context, string, int) (throttle.Decision, error)) (throttle.Decision, error) {
	start := r.Start()
	d, err := decide(ctx, key, n)
	r.Call(m, key, n, d, err, start)
	return d, err
}

// Reserve makes reserve(ctx, key, n, maxWait), a Reserve call, and
// reports it, its Decision as throttle.Observe states it: Allowed when the
// reservation is OK, with its Limit and its Delay as RetryAfter.
func (r *To) Reserve(ctx context.Context, key string, n int, maxWait time.Duration, reserve func(context.Context, string, int, time.Duration) (throttle.Reservation, error)) (throttle.Reservation, error) {
	start := r.Start()
	res, err := reserve(ctx, key, n, maxWait)
	if r.o != nil {
		d := throttle.Decision{Allowed: res.OK, Limit: res.Limit, RetryAfter: res.Delay}
		r.Call(limiterkit.MethodReserve, key, n, d, err, start)
	}
	return res, err
}

// Held returns release, for the n units of key that a call of method m
// (TryHold or Hold) holds, reporting an EventRelease when it first gives
// them back, as throttle.Observe does.
func (r *To) Held(release func(), m limiterkit.Method, key string, n int) func() {
	if r.o == nil {
		return release
	}
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			release()
			r.Event(throttle.Event{Kind: throttle.EventRelease, Key: key, N: n})
		}
	}
}

// Event reports e, a limiter's own event (a breaker, a fallback, a
// reload), under the name.
func (r *To) Event(e throttle.Event) {
	if r.o != nil {
		e.Limiter = r.name
		r.o.Observe(e)
	}
}
