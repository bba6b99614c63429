// Package throttle defines the contract shared by every rate limiter and
// concurrency limiter in this module: the Limiter interface, the Decision it
// returns, the Rate type, sentinel errors, clock injection, and the helpers
// built on top of them (Wait, Wrap).
//
//	l, err := tokenbucket.New(throttle.PerSecond(10), 20) // 10/s per key, bursts of 20
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	d, err := l.Allow(ctx, clientIP, 1)
//	switch {
//	case err != nil: // bad input or a failed backend: errors.Is(err, throttle.ErrInvalid), ...
//		return err
//	case !d.Allowed: // a denial is a value, saying when to come back
//		log.Printf("%s: retry after %v", clientIP, d.RetryAfter)
//	}
//
// Algorithms live in their own packages (tokenbucket, leakybucket,
// fixedwindow, slidingwindow, slidinglog, counting) and shared or
// distributed variants under distributed/. Each one implements Limiter, so
// swapping an algorithm or moving from a local to a shared limit is a
// one-line change. Package storelimit keeps the state of a limit
// elsewhere (a database): it runs any storelimit.Algorithm over any
// storelimit.Store, and docs/extending.md lists what a new algorithm,
// store or wrapper touches.
//
// A denial is a value (Decision.Allowed == false), not an error. Errors
// report bad input (wrapping ErrInvalid or ErrExceedsLimit) and failures of
// a backend (wrapping ErrUnavailable); errors.Is works on every error
// returned by this module.
package throttle

import (
	"context"
	"sync/atomic"
	"time"
)

// Limiter decides whether n units of work for key may proceed now.
//
// Allow never blocks: when the request does not fit, it returns a Decision
// with Allowed false and RetryAfter set. Implementations in this module are
// safe for concurrent use by multiple goroutines. A limiter that guards a
// single resource ignores key.
type Limiter interface {
	Allow(ctx context.Context, key string, n int) (Decision, error)
}

// Decision is the outcome of one call to Allow.
type Decision struct {
	// Allowed reports whether the n units were admitted (and charged).
	Allowed bool
	// Limit is the capacity: the burst of a bucket, the limit of a window,
	// or the concurrency cap.
	Limit int
	// Remaining is how many units could still be admitted right after this
	// call, with no time passing.
	Remaining int
	// RetryAfter is the earliest time after which the same request can
	// succeed if nothing else is admitted meanwhile. It is 0 when Allowed,
	// and for limiters that free capacity by release rather than by time.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to full capacity.
	ResetAfter time.Duration
}

// LimiterFunc adapts an ordinary function to the Limiter interface.
type LimiterFunc func(ctx context.Context, key string, n int) (Decision, error)

// Allow calls f(ctx, key, n).
func (f LimiterFunc) Allow(ctx context.Context, key string, n int) (Decision, error) {
	return f(ctx, key, n)
}

// Reserver is implemented by limiters that can book future capacity: the
// optimistic mode in which a caller that does not fit now is given a slot
// in the future and waits for it, in arrival order.
type Reserver interface {
	// Reserve books n units for key at the earliest time they fit, unless
	// that is more than maxWait from now; then nothing is booked and the
	// returned Reservation has OK false. maxWait bounds how far ahead
	// permits may be reserved: it is the "max reserved permits" bound
	// expressed as time. A maxWait of 0 books only what is free now.
	Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (Reservation, error)
}

// Reservation is capacity booked by a Reserver.
//
// The zero value is a reservation that was not granted. A Reservation may
// be copied; all copies share one booking, so the capacity is given back at
// most once, whichever copy calls Cancel and from however many goroutines.
type Reservation struct {
	// OK reports whether capacity was booked.
	OK bool
	// Delay is how long the holder must wait before acting. When OK is
	// false it is the earliest time after which the same reservation
	// would fit within maxWait (a hint for backing off).
	Delay time.Duration
	// Limit is the capacity of the limiter that made the reservation.
	Limit int

	b *booking // nil when there is nothing to give back
}

type booking struct {
	cancel func()
	done   atomic.Bool
}

// newReservation returns a granted reservation, to be honoured after
// delay, of a limiter of capacity limit: what a Reserver returns when it
// books (package limiterkit gives it to the Reservers of this module).
// cancel, which may be nil, gives the booked capacity back; the
// Reservation and all its copies call it at most once.
func newReservation(delay time.Duration, limit int, cancel func()) Reservation {
	r := Reservation{OK: true, Delay: delay, Limit: limit}
	if cancel != nil {
		r.b = &booking{cancel: cancel}
	}
	return r
}

// Cancel gives the booked capacity back to the limiter, as far as the
// limiter can still take it back (capacity booked behind this reservation
// is not moved earlier). Call it when the reserved work will not be done.
// Cancel on a reservation that was not granted, or a second time, does
// nothing.
func (r Reservation) Cancel() {
	if b := r.b; b != nil && b.done.CompareAndSwap(false, true) {
		b.cancel()
	}
}
