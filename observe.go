package throttle

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"
)

// EventKind tells what an Event reports.
type EventKind uint8

// Kinds of Event.
const (
	// EventDecision is a call that returned a Decision (allowed or not).
	EventDecision EventKind = iota
	// EventError is a call that failed: Err is set.
	EventError
	// EventFallback is a call decided by a failure policy (fail open,
	// fail closed or a fallback limiter) because the backend failed: both
	// Decision and Err (the backend's error) are set. It comes in addition
	// to the call's EventDecision (or EventError, for a refusal that
	// returns the backend's error): every call is one decision, and some
	// decisions are fallbacks too.
	EventFallback
	// EventBreakerOpen reports that a circuit breaker opened: calls stop
	// reaching the backend until it has cooled down.
	EventBreakerOpen
	// EventBreakerClosed reports that the breaker closed again.
	EventBreakerClosed
	// EventWarning reports a condition an operator should see (a backend
	// configured unsafely, a lease that expired): Err describes it.
	EventWarning
	// EventLimit reports that an adaptive limit changed: Decision.Limit
	// is the new limit, N the units in flight, Latency the mean RTT of
	// the window that moved it.
	EventLimit
	// EventRetry reports a failed attempt that a retry policy judged
	// retryable: Decision.Allowed says whether it is retried (false: the
	// retry budget or the attempt cap refused), Decision.RetryAfter is
	// the back-off, N the attempt that failed (1 for the first).
	EventRetry
	// EventRelease reports that the N units an allowed TryHold or Hold
	// held (an EventDecision of that Method) were given back.
	EventRelease
	// EventReload reports that a new configuration (a rules document) was
	// put in force: Key names its version. A rejected one is an
	// EventWarning.
	EventReload
)

var kindNames = [...]string{"decision", "error", "fallback", "breaker_open", "breaker_closed", "warning", "limit", "retry", "release", "reload"}

// String returns the kind's name in lower case, as metrics label it.
func (k EventKind) String() string { return nameOf(kindNames[:], k, "unknown") }

// Event is what an Observer is told about one call or one change of state.
type Event struct {
	Kind     EventKind
	Limiter  string // the name given to Observe or to a backend's options
	Key      string
	N        int
	Decision Decision
	Err      error
	// Latency is how long the call took: set by Observe for an Observer
	// that asks for it (see Observer) and by backends that measure their
	// round trips; 0 where it is not measured.
	Latency time.Duration
	// Held is set on the EventDecision of an allowed TryHold or Hold:
	// its units stay held until an EventRelease reports them given back.
	Held bool
}

// Observer receives Events, synchronously, on the goroutine of the call
// they describe: it must be safe for concurrent use and quick. An Event is
// passed by value; an Observer that keeps nothing allocates nothing.
//
// Observe gives any limiter one; a limiter or wrapper with an observer of
// its own takes it as WithObserver(name, o), and then reports every call
// as Observe would (one EventDecision or EventError each) plus its own
// events (breaker, fallback, warning, reload).
//
// An Observer that also has a method ObservesLatency() bool returning
// true wants each call timed: Observe then reads the clock before and
// after every call and sets Event.Latency. Ask for it on limiters backed
// by a store, where the round trip is what a dashboard watches; an
// in-process decision takes tens of nanoseconds.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// Observe returns l reporting every call (Allow, AllowQuota, TryHold, Hold,
// Reserve) to o under name. The result keeps exactly l's abilities: it
// implements Reserver, Holder, QuotaReporter and QuotaAllower when l
// does, and only then, so Wait, TryHold, Wrap and the HTTP middleware
// book, hold and release through it as through l.
// With a nil o, Observe returns l itself, so an unset observer costs
// nothing.
func Observe(l Limiter, name string, o Observer) Limiter {
	if o == nil {
		return l
	}
	timed := bridge.ObservesLatency(o)
	report := func(c *call, d Decision, err error, start time.Time) {
		e := Event{Kind: EventDecision, Limiter: name, Key: c.Key, N: c.N, Decision: d, Err: err, Held: err == nil && d.Allowed && c.Method.Holds()}
		if timed {
			e.Latency = time.Since(start)
		}
		if err != nil {
			e.Kind = EventError
		}
		o.Observe(e)
	}
	// Allow, the path of every decision, reports without a Call's trip
	// through the Decorator.
	allow := func(ctx context.Context, key string, n int) (Decision, error) {
		if timed {
			start := time.Now()
			d, err := l.Allow(ctx, key, n)
			report(&call{Method: bridge.MethodAllow, Key: key, N: n}, d, err, start)
			return d, err
		}
		d, err := l.Allow(ctx, key, n)
		e := Event{Kind: EventDecision, Limiter: name, Key: key, N: n, Decision: d, Err: err}
		if err != nil {
			e.Kind = EventError
		}
		o.Observe(e)
		return d, err
	}
	return decorate(l, func(ctx context.Context, c call, next nextFunc) (result, error) {
		var start time.Time
		if timed {
			start = time.Now()
		}
		r, err := next(ctx, c)
		report(&c, r.Decision, err, start)
		if r.Release != nil && err == nil && r.Decision.Allowed && c.Method.Holds() {
			r.Release = releaseReported(r.Release, o, Event{Kind: EventRelease, Limiter: name, Key: c.Key, N: c.N})
		}
		return r, err
	}, allow)
}

// releaseReported returns release that also reports e, once, however
// often it is called.
func releaseReported(release func(), o Observer, e Event) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			release()
			o.Observe(e)
		}
	}
}
