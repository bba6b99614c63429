package throttle

import (
	"context"
	"time"
)

// Quota is a limit stated as units per window, the form HTTP's RateLimit
// header fields use. A token bucket of burst b refilling at r reports
// Limit b and Window b/r (the time to refill from empty); a window limiter
// reports its limit and window; a concurrency limiter reports its cap and
// a zero Window.
type Quota struct {
	Limit  int
	Window time.Duration
}

// QuotaReporter is implemented by limiters that can state their Quota.
// Quota is safe for concurrent use and follows runtime changes of the
// limiter's parameters.
type QuotaReporter interface {
	Quota() Quota
}

// QuotaAllower is implemented by limiters that take the limit with each
// call, as go-redis/redis_rate does: one limiter serves keys of different
// limits (tiers, per-key rules). A key keeps what it has used when its
// limit changes, read under the new limit.
type QuotaAllower interface {
	AllowQuota(ctx context.Context, key string, n int, rate Rate, burst int) (Decision, error)
}

// Holder is implemented by limiters whose units are held until released
// (concurrency limits) rather than spent. Generic code (TryHold, Wrap, the
// HTTP middleware) uses it so that what is held is always given back.
//
// Held units have one vocabulary in this module: TryHold takes them if
// they fit now, Hold waits for them, and both return the func that gives
// them back.
//
// For a Holder, a plain Allow takes units that only the limiter's own
// Release method returns; prefer TryHold.
type Holder interface {
	Limiter
	// TryHold admits n units for key if they fit now. When the Decision
	// is Allowed, release gives the units back; it is safe to call more
	// than once and from any goroutine (only the first call counts).
	// When denied, release is a no-op func, never nil.
	TryHold(ctx context.Context, key string, n int) (d Decision, release func(), err error)
	// Hold waits until n units for key fit or ctx is done.
	Hold(ctx context.Context, key string, n int) (release func(), err error)
}

func noRelease() {}

// TryHold asks l for n units of key without blocking and returns a func
// that gives back whatever the call holds: for a Holder the held units
// (its TryHold), for any other limiter nothing (spent units are not
// refunded). release is never nil and may be called more than once.
func TryHold(ctx context.Context, l Limiter, key string, n int) (d Decision, release func(), err error) {
	if h, ok := l.(Holder); ok {
		return h.TryHold(ctx, key, n)
	}
	d, err = l.Allow(ctx, key, n)
	return d, noRelease, err
}
