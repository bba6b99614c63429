package throttle

import (
	"context"
	"time"
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
	// Decision and Err (the backend's error) are set.
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
)

var kindNames = [...]string{"decision", "error", "fallback", "breaker_open", "breaker_closed", "warning", "limit", "retry"}

// String returns the kind's name in lower case, as metrics label it.
func (k EventKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Event is what an Observer is told about one call or one change of state.
type Event struct {
	Kind     EventKind
	Limiter  string // the name given to Observe or to a backend's options
	Key      string
	N        int
	Decision Decision
	Err      error
	// Latency is how long the call took; it is set by backends that
	// measure their round trips, and 0 where it is not measured.
	Latency time.Duration
}

// Observer receives Events, synchronously, on the goroutine of the call
// they describe: it must be safe for concurrent use and quick. An Event is
// passed by value; an Observer that keeps nothing allocates nothing.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// Observe returns l reporting every Allow (and TryHold, Reserve) to o
// under name. The result keeps l's abilities: it implements Reserver,
// Holder and QuotaReporter exactly when l does. With a nil o, Observe
// returns l itself, so an unset observer costs nothing.
func Observe(l Limiter, name string, o Observer) Limiter {
	if o == nil {
		return l
	}
	b := &observed{l: l, name: name, o: o}
	r, isR := l.(Reserver)
	h, isH := l.(Holder)
	q, isQ := l.(QuotaReporter)
	rp, hp := reservePart{b, r}, holdPart{b, h}
	switch {
	case isR && isH && isQ:
		return &struct {
			*observed
			reservePart
			holdPart
			QuotaReporter
		}{b, rp, hp, q}
	case isR && isH:
		return &struct {
			*observed
			reservePart
			holdPart
		}{b, rp, hp}
	case isR && isQ:
		return &struct {
			*observed
			reservePart
			QuotaReporter
		}{b, rp, q}
	case isH && isQ:
		return &struct {
			*observed
			holdPart
			QuotaReporter
		}{b, hp, q}
	case isR:
		return &struct {
			*observed
			reservePart
		}{b, rp}
	case isH:
		return &struct {
			*observed
			holdPart
		}{b, hp}
	case isQ:
		return &struct {
			*observed
			QuotaReporter
		}{b, q}
	}
	return b
}

type observed struct {
	l    Limiter
	name string
	o    Observer
}

func (b *observed) report(key string, n int, d Decision, err error) {
	e := Event{Kind: EventDecision, Limiter: b.name, Key: key, N: n, Decision: d, Err: err}
	if err != nil {
		e.Kind = EventError
	}
	b.o.Observe(e)
}

// Allow asks the wrapped limiter and reports the outcome.
func (b *observed) Allow(ctx context.Context, key string, n int) (Decision, error) {
	d, err := b.l.Allow(ctx, key, n)
	b.report(key, n, d, err)
	return d, err
}

// reservePart and holdPart add the reporting Reserve and TryHold/Hold
// to an observed limiter that has them.
type reservePart struct {
	b *observed
	r Reserver
}

func (p reservePart) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (Reservation, error) {
	res, err := p.r.Reserve(ctx, key, n, maxWait)
	p.b.report(key, n, Decision{Allowed: res.OK, Limit: res.Limit, RetryAfter: res.Delay}, err)
	return res, err
}

type holdPart struct {
	b *observed
	h Holder
}

func (p holdPart) TryHold(ctx context.Context, key string, n int) (Decision, func(), error) {
	d, release, err := p.h.TryHold(ctx, key, n)
	p.b.report(key, n, d, err)
	return d, release, err
}

func (p holdPart) Hold(ctx context.Context, key string, n int) (func(), error) {
	release, err := p.h.Hold(ctx, key, n)
	p.b.report(key, n, Decision{Allowed: err == nil}, err)
	return release, err
}
