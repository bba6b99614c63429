package throttle

import (
	"context"
	"time"
)

// Method names the Limiter method a Call was made through.
type Method uint8

// Methods a Call can be made through.
const (
	MethodAllow      Method = iota // Limiter.Allow
	MethodAllowQuota               // QuotaAllower.AllowQuota
	MethodTryHold                  // Holder.TryHold
	MethodHold                     // Holder.Hold
	MethodReserve                  // Reserver.Reserve
)

var methodNames = [...]string{"Allow", "AllowQuota", "TryHold", "Hold", "Reserve"}

// String returns the method's name.
func (m Method) String() string { return nameOf(methodNames[:], m, "Method(?)") }

// nameOf returns names[v], or unknown for a v past them.
func nameOf[T ~uint8](names []string, v T, unknown string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return unknown
}

// Call is one call of a limiter's method with its arguments: the form in
// which a Decorator sees every call, whatever the method.
type Call struct {
	Method  Method
	Key     string
	N       int
	Rate    Rate          // AllowQuota's rate
	Burst   int           // AllowQuota's burst
	MaxWait time.Duration // Reserve's bound
}

// Result is what a Call returned.
type Result struct {
	// Decision is the outcome of every method. For Hold it is Allowed
	// when the units are held; for Reserve it is Allowed when the
	// reservation is OK, with its Limit and its Delay as RetryAfter.
	Decision Decision
	// Release gives back what TryHold or Hold holds; nil for the other
	// methods and for calls that hold nothing.
	Release func()
	// Reservation is Reserve's result.
	Reservation Reservation
}

// Next passes a Call on to the decorated limiter.
type Next func(ctx context.Context, c Call) (Result, error)

// Decorator acts around every call of the limiter it decorates: before
// and after next, or instead of it. It must be safe for concurrent use.
type Decorator func(ctx context.Context, c Call, next Next) (Result, error)

// Decorate returns l with d around each of its calls. The result keeps
// exactly l's abilities: it implements Reserver, Holder, QuotaReporter and
// QuotaAllower when l does, and only then, so generic code (Wait, TryHold,
// Wrap, the HTTP middleware) books, holds and releases through it as it
// would through l. Allow, AllowQuota, TryHold, Hold and Reserve go through
// d; Quota is l's. Unwrap returns l.
//
// Every wrapper in this module (Observe, failsafe) is a Decorator, so a
// wrapper never hides what the limiter it wraps can do.
func Decorate(l Limiter, d Decorator) Limiter { return DecorateAllow(l, d, nil) }

// DecorateAllow is Decorate whose Allow, the path every decision takes,
// calls allow instead of d, without building a Call and a Result. allow
// must decide as d does for a MethodAllow Call (Observe and failsafe.New
// give theirs); a nil allow makes DecorateAllow Decorate.
func DecorateAllow(l Limiter, d Decorator, allow func(ctx context.Context, key string, n int) (Decision, error)) Limiter {
	b := &decorated{l: l, d: d, allow: allow}
	b.next = b.invoke
	var mask int
	if _, ok := l.(Reserver); ok {
		mask |= canReserve
	}
	if _, ok := l.(Holder); ok {
		mask |= canHold
	}
	if _, ok := l.(QuotaReporter); ok {
		mask |= canQuota
	}
	if _, ok := l.(QuotaAllower); ok {
		mask |= canAllowQuota
	}
	return withAbilities[mask](b)
}

// Invoke makes c on l and returns its Result: the method c names, or, when
// l lacks it, the nearest l can do (Allow for AllowQuota; Allow holding
// nothing for TryHold; Wait holding nothing for Hold; a reservation of
// what is free now for Reserve). A fallback limiter is asked this way.
func Invoke(ctx context.Context, l Limiter, c Call) (Result, error) {
	switch c.Method {
	case MethodAllowQuota:
		if q, ok := l.(QuotaAllower); ok {
			d, err := q.AllowQuota(ctx, c.Key, c.N, c.Rate, c.Burst)
			return Result{Decision: d}, err
		}
	case MethodTryHold:
		d, release, err := TryHold(ctx, l, c.Key, c.N)
		return Result{Decision: d, Release: release}, err
	case MethodHold:
		if h, ok := l.(Holder); ok {
			release, err := h.Hold(ctx, c.Key, c.N)
			return Result{Decision: Decision{Allowed: err == nil}, Release: release}, err
		}
		err := Wait(ctx, l, c.Key, c.N)
		return Result{Decision: Decision{Allowed: err == nil}, Release: noRelease}, err
	case MethodReserve:
		if r, ok := l.(Reserver); ok {
			res, err := r.Reserve(ctx, c.Key, c.N, c.MaxWait)
			return reserved(res), err
		}
		d, err := l.Allow(ctx, c.Key, c.N)
		if err != nil || !d.Allowed {
			return Result{Decision: d, Reservation: Reservation{Delay: d.RetryAfter, Limit: d.Limit}}, err
		}
		return Result{Decision: d, Reservation: Reservation{OK: true, Limit: d.Limit}}, nil
	}
	d, err := l.Allow(ctx, c.Key, c.N)
	return Result{Decision: d}, err
}

func reserved(res Reservation) Result {
	return Result{Decision: Decision{Allowed: res.OK, Limit: res.Limit, RetryAfter: res.Delay}, Reservation: res}
}

// decorated is the Limiter of Decorate; the parts below add the other
// abilities to it.
type decorated struct {
	l    Limiter
	d    Decorator
	next Next // invoke, made once so that a call allocates no closure
	// allow, when set, decides Allow as d would, directly.
	allow func(ctx context.Context, key string, n int) (Decision, error)
}

func (b *decorated) invoke(ctx context.Context, c Call) (Result, error) { return Invoke(ctx, b.l, c) }

// Allow makes the call through the decorator.
func (b *decorated) Allow(ctx context.Context, key string, n int) (Decision, error) {
	if b.allow != nil {
		return b.allow(ctx, key, n)
	}
	r, err := b.d(ctx, Call{Method: MethodAllow, Key: key, N: n}, b.next)
	return r.Decision, err
}

// Unwrap returns the decorated limiter.
func (b *decorated) Unwrap() Limiter { return b.l }

type reservePart struct{ b *decorated }

func (p reservePart) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (Reservation, error) {
	r, err := p.b.d(ctx, Call{Method: MethodReserve, Key: key, N: n, MaxWait: maxWait}, p.b.next)
	return r.Reservation, err
}

type holdPart struct{ b *decorated }

func (p holdPart) TryHold(ctx context.Context, key string, n int) (Decision, func(), error) {
	r, err := p.b.d(ctx, Call{Method: MethodTryHold, Key: key, N: n}, p.b.next)
	if r.Release == nil {
		r.Release = noRelease
	}
	return r.Decision, r.Release, err
}

func (p holdPart) Hold(ctx context.Context, key string, n int) (func(), error) {
	r, err := p.b.d(ctx, Call{Method: MethodHold, Key: key, N: n}, p.b.next)
	if r.Release == nil {
		r.Release = noRelease
	}
	return r.Release, err
}

type quotaPart struct{ b *decorated }

func (p quotaPart) Quota() Quota { return p.b.l.(QuotaReporter).Quota() }

type allowQuotaPart struct{ b *decorated }

func (p allowQuotaPart) AllowQuota(ctx context.Context, key string, n int, rate Rate, burst int) (Decision, error) {
	r, err := p.b.d(ctx, Call{Method: MethodAllowQuota, Key: key, N: n, Rate: rate, Burst: burst}, p.b.next)
	return r.Decision, err
}

// The abilities a decorated limiter can have, as bits of an index into
// withAbilities.
const (
	canReserve = 1 << iota
	canHold
	canQuota
	canAllowQuota
)

type (
	rP = reservePart
	hP = holdPart
	qP = quotaPart
	aP = allowQuotaPart
)

// withAbilities[mask] is the decorated limiter with the parts of mask: the
// one place that lists the combinations.
var withAbilities = [16]func(*decorated) Limiter{
	func(b *decorated) Limiter { return b },
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
		}{b, rP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			hP
		}{b, hP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			hP
		}{b, rP{b}, hP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			qP
		}{b, qP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			qP
		}{b, rP{b}, qP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			hP
			qP
		}{b, hP{b}, qP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			hP
			qP
		}{b, rP{b}, hP{b}, qP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			aP
		}{b, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			aP
		}{b, rP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			hP
			aP
		}{b, hP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			hP
			aP
		}{b, rP{b}, hP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			qP
			aP
		}{b, qP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			qP
			aP
		}{b, rP{b}, qP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			hP
			qP
			aP
		}{b, hP{b}, qP{b}, aP{b}}
	},
	func(b *decorated) Limiter {
		return &struct {
			*decorated
			rP
			hP
			qP
			aP
		}{b, rP{b}, hP{b}, qP{b}, aP{b}}
	},
}
