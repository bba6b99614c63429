package throttle

import (
	"context"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"
)

// nameOf returns names[v], or unknown for a v past them.
func nameOf[T ~uint8](names []string, v T, unknown string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return unknown
}

// call, result, nextFunc and decorator are the shapes of package
// limiterkit's Call, Result, Next and Decorator, the seam of every
// wrapper in this module. They are aliases of unnamed types so that package
// limiterkit, which imports this one, names the same types without this
// package exporting them: a change here that limiterkit does not repeat
// fails its initialisation, and so every test that uses it.
type (
	call = struct {
		Method  bridge.Method
		Key     string
		N       int
		Rate    Rate          // AllowQuota's rate
		Burst   int           // AllowQuota's burst
		MaxWait time.Duration // Reserve's bound
	}
	result = struct {
		Decision    Decision
		Release     func()
		Reservation Reservation
	}
	nextFunc  = func(ctx context.Context, c call) (result, error)
	decorator = func(ctx context.Context, c call, next nextFunc) (result, error)
)

func init() {
	bridge.Decorate = decorate
	bridge.Invoke = invoke
	bridge.NewReservation = newReservation
}

// decorate returns l with d around each of its calls, keeping exactly l's
// abilities; allow, when not nil, decides Allow as d would, directly (see
// package limiterkit, which documents it).
func decorate(l Limiter, d decorator, allow func(ctx context.Context, key string, n int) (Decision, error)) Limiter {
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

// invoke makes c on l (see package limiterkit).
func invoke(ctx context.Context, l Limiter, c call) (result, error) {
	switch c.Method {
	case bridge.MethodAllowQuota:
		if q, ok := l.(QuotaAllower); ok {
			d, err := q.AllowQuota(ctx, c.Key, c.N, c.Rate, c.Burst)
			return result{Decision: d}, err
		}
	case bridge.MethodTryHold:
		d, release, err := TryHold(ctx, l, c.Key, c.N)
		return result{Decision: d, Release: release}, err
	case bridge.MethodHold:
		if h, ok := l.(Holder); ok {
			release, err := h.Hold(ctx, c.Key, c.N)
			return result{Decision: Decision{Allowed: err == nil}, Release: release}, err
		}
		err := Wait(ctx, l, c.Key, c.N)
		return result{Decision: Decision{Allowed: err == nil}, Release: noRelease}, err
	case bridge.MethodReserve:
		if r, ok := l.(Reserver); ok {
			res, err := r.Reserve(ctx, c.Key, c.N, c.MaxWait)
			return reserved(res), err
		}
		d, err := l.Allow(ctx, c.Key, c.N)
		if err != nil || !d.Allowed {
			return result{Decision: d, Reservation: Reservation{Delay: d.RetryAfter, Limit: d.Limit}}, err
		}
		return result{Decision: d, Reservation: Reservation{OK: true, Limit: d.Limit}}, nil
	}
	d, err := l.Allow(ctx, c.Key, c.N)
	return result{Decision: d}, err
}

func reserved(res Reservation) result {
	return result{Decision: Decision{Allowed: res.OK, Limit: res.Limit, RetryAfter: res.Delay}, Reservation: res}
}

// decorated is the Limiter of decorate; the parts below add the other
// abilities to it.
type decorated struct {
	l    Limiter
	d    decorator
	next nextFunc // invoke, made once so that a call allocates no closure
	// allow, when set, decides Allow as d would, directly.
	allow func(ctx context.Context, key string, n int) (Decision, error)
}

func (b *decorated) invoke(ctx context.Context, c call) (result, error) { return invoke(ctx, b.l, c) }

// Allow makes the call through the decorator.
func (b *decorated) Allow(ctx context.Context, key string, n int) (Decision, error) {
	if b.allow != nil {
		return b.allow(ctx, key, n)
	}
	r, err := b.d(ctx, call{Method: bridge.MethodAllow, Key: key, N: n}, b.next)
	return r.Decision, err
}

// Unwrap returns the decorated limiter.
func (b *decorated) Unwrap() Limiter { return b.l }

type reservePart struct{ b *decorated }

func (p reservePart) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (Reservation, error) {
	r, err := p.b.d(ctx, call{Method: bridge.MethodReserve, Key: key, N: n, MaxWait: maxWait}, p.b.next)
	return r.Reservation, err
}

type holdPart struct{ b *decorated }

func (p holdPart) TryHold(ctx context.Context, key string, n int) (Decision, func(), error) {
	r, err := p.b.d(ctx, call{Method: bridge.MethodTryHold, Key: key, N: n}, p.b.next)
	if r.Release == nil {
		r.Release = noRelease
	}
	return r.Decision, r.Release, err
}

func (p holdPart) Hold(ctx context.Context, key string, n int) (func(), error) {
	r, err := p.b.d(ctx, call{Method: bridge.MethodHold, Key: key, N: n}, p.b.next)
	if r.Release == nil {
		r.Release = noRelease
	}
	return r.Release, err
}

type quotaPart struct{ b *decorated }

func (p quotaPart) Quota() Quota { return p.b.l.(QuotaReporter).Quota() }

type allowQuotaPart struct{ b *decorated }

func (p allowQuotaPart) AllowQuota(ctx context.Context, key string, n int, rate Rate, burst int) (Decision, error) {
	r, err := p.b.d(ctx, call{Method: bridge.MethodAllowQuota, Key: key, N: n, Rate: rate, Burst: burst}, p.b.next)
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
