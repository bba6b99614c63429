package limiterkit

// The seam of every wrapper in this module (failsafe, throttle.Observe,
// the observers of the backends): a Decorator acts around every call of
// the limiter it wraps, whatever the method, and the wrapped limiter keeps
// exactly the abilities of the one inside. The machinery is package
// throttle's (throttle.Observe uses it); this file names its types, which
// throttle keeps out of its user-facing API.

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/bridge"
)

// Method names the Limiter method a Call was made through.
type Method = bridge.Method

// Methods a Call can be made through.
const (
	MethodAllow      = bridge.MethodAllow      // Limiter.Allow
	MethodAllowQuota = bridge.MethodAllowQuota // QuotaAllower.AllowQuota
	MethodTryHold    = bridge.MethodTryHold    // Holder.TryHold
	MethodHold       = bridge.MethodHold       // Holder.Hold
	MethodReserve    = bridge.MethodReserve    // Reserver.Reserve
)

// Call is one call of a limiter's method with its arguments: the form in
// which a Decorator sees every call, whatever the method. (An alias of an
// unnamed type, the same as package throttle's, so that throttle need not
// export it.)
type Call = struct {
	Method  bridge.Method
	Key     string
	N       int
	Rate    throttle.Rate // AllowQuota's rate
	Burst   int           // AllowQuota's burst
	MaxWait time.Duration // Reserve's bound
}

// Result is what a Call returned: Decision is the outcome of every method
// (for Hold, Allowed when the units are held; for Reserve, Allowed when
// the reservation is OK, with its Limit and its Delay as RetryAfter);
// Release gives back what TryHold or Hold holds (nil for the other
// methods and for calls that hold nothing); Reservation is Reserve's.
type Result = struct {
	Decision    throttle.Decision
	Release     func()
	Reservation throttle.Reservation
}

// Next passes a Call on to the decorated limiter.
type Next = func(ctx context.Context, c Call) (Result, error)

// Decorator acts around every call of the limiter it decorates: before
// and after next, or instead of it. It must be safe for concurrent use.
type Decorator = func(ctx context.Context, c Call, next Next) (Result, error)

var (
	decorate       = bridge.Decorate.(func(throttle.Limiter, Decorator, func(context.Context, string, int) (throttle.Decision, error)) throttle.Limiter)
	invoke         = bridge.Invoke.(func(context.Context, throttle.Limiter, Call) (Result, error))
	newReservation = bridge.NewReservation.(func(time.Duration, int, func()) throttle.Reservation)
)

// Decorate returns l with d around each of its calls. The result keeps
// exactly l's abilities: it implements throttle.Reserver, Holder,
// QuotaReporter and QuotaAllower when l does, and only then, so generic
// code (throttle.Wait, TryHold, Wrap, the HTTP middleware) books, holds
// and releases through it as it would through l. Allow, AllowQuota,
// TryHold, Hold and Reserve go through d; Quota is l's. Unwrap returns l.
//
// allow, when not nil, is the result's Allow, the path every decision
// takes, without building a Call and a Result: it must decide as d does
// for a MethodAllow Call.
func Decorate(l throttle.Limiter, d Decorator, allow func(ctx context.Context, key string, n int) (throttle.Decision, error)) throttle.Limiter {
	return decorate(l, d, allow)
}

// Invoke makes c on l and returns its Result: the method c names, or, when
// l lacks it, the nearest l can do (Allow for AllowQuota; Allow holding
// nothing for TryHold; Wait holding nothing for Hold; a reservation of
// what is free now for Reserve). A fallback limiter is asked this way.
func Invoke(ctx context.Context, l throttle.Limiter, c Call) (Result, error) {
	return invoke(ctx, l, c)
}

// NewReservation returns a granted reservation, to be honoured after
// delay, of a limiter of capacity limit: what a Reserver returns when it
// books. cancel, which may be nil, gives the booked capacity back; the
// Reservation and all its copies call it at most once.
func NewReservation(delay time.Duration, limit int, cancel func()) throttle.Reservation {
	return newReservation(delay, limit, cancel)
}
