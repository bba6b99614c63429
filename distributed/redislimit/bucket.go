package redislimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/gcra"
	"github.com/throttlekit/throttle/internal/lease"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Bucket is a token bucket shared through Redis, run as GCRA: the state of
// a key is one instant, its theoretical arrival time. It has the same
// decisions as tokenbucket.Limiter for the same trace: burst units at
// once, then one unit per rate interval (rounded up to a nanosecond).
//
// It implements throttle.Reserver: Reserve books the earliest slot in
// arrival order across every process sharing the key, which is the
// "permits at least d apart" of NewTokenBucket(client, throttle.NewRate(1, d),
// 1) with optimistic reservation.
//
// A Bucket is safe for concurrent use. The zero value is not usable; call
// NewTokenBucket.
type Bucket struct {
	*core
	cfg   *gcra.Config
	lease *lease.Leaser
	tau   any // cfg.Tau and cfg.Interval, boxed once
	cost1 any
}

var (
	_ throttle.Limiter       = (*Bucket)(nil)
	_ throttle.Reserver      = (*Bucket)(nil)
	_ throttle.QuotaReporter = (*Bucket)(nil)
	_ throttle.QuotaAllower  = (*Bucket)(nil)
)

// NewTokenBucket returns a token bucket of the given rate and burst whose
// state lives in Redis under each key. Errors wrap throttle.ErrInvalid.
//
// It is also the leaky bucket meter of leakybucket.New (a bucket of burst
// units draining at rate admits a request that fits: the same decisions),
// and, with throttle.NewRate(1, d) and a burst of 1, the limiter of "at most
// once every d" shared by every process: permits at least d apart. Use
// Reserve (or throttle.Wait, which reserves) to book the next free permit
// and wait for it; maxWait bounds how many permits may be booked ahead
// (maxWait/d), beyond which callers are told to back off. Allow is the
// pessimistic mode: nothing is booked, the caller backs off for
// RetryAfter (throttle.Wait with throttle.MaxWait(0) adds jitter). A
// booked permit is used at its instant or wasted: the bucket never
// accumulates permits that were not taken (the state is the next free
// instant, and idle time never moves it back), so a process that books a
// permit and crashes costs the others one interval, not more.
func NewTokenBucket(client redis.UniversalClient, rate throttle.Rate, burst int, opts ...Option) (*Bucket, error) {
	return newBucket(client, "tb", rate, burst, opts)
}

// maxSpan is the longest burst·interval of a Redis bucket, and the
// furthest ahead of now a reservation books: 2^52 ns, about 52 days, as
// maxWindow. Scripts compute in Lua numbers (doubles), exact to the
// nanosecond up to 2^53, and a debt plus a request's cost stays below
// that; a longer span is refused rather than rounded.
const maxSpan = time.Duration(1 << 52)

// checkSpan refuses a configuration whose span is above maxSpan.
func checkSpan(cfg *gcra.Config) error {
	if cfg.Tau > int64(maxSpan) {
		return fmt.Errorf("%w: burst %d at rate %v spans %v, above the %v a Redis bucket computes exactly", throttle.ErrInvalid, cfg.Burst, cfg.Rate, time.Duration(cfg.Tau), maxSpan)
	}
	return nil
}

func newBucket(client redis.UniversalClient, alg string, rate throttle.Rate, burst int, opts []Option) (*Bucket, error) {
	cfg, err := gcra.NewConfig(rate, burst)
	if err != nil {
		return nil, err
	}
	if err := checkSpan(cfg); err != nil {
		return nil, err
	}
	c, conf, err := newCore(client, alg, fmt.Sprintf("%v,%d", time.Duration(cfg.Interval), burst), burst, opts)
	if err != nil {
		return nil, err
	}
	b := &Bucket{core: c, cfg: cfg, tau: cfg.Tau, cost1: cfg.Interval}
	if err := b.initLease(conf); err != nil {
		return nil, err
	}
	return b, nil
}

// Allow admits n units for key now or denies them, in one round trip.
func (b *Bucket) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return b.allowWith(ctx, key, n, b.allow)
}

func (b *Bucket) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if b.lease != nil {
		return b.allowLeased(ctx, key, n)
	}
	return b.decide(ctx, key, n, b.cfg, b.tau)
}

// decide runs one decision of n units for key under cfg (tau is cfg.Tau,
// boxed) in Redis.
func (b *Bucket) decide(ctx context.Context, key string, n int, cfg *gcra.Config, tau any) (throttle.Decision, error) {
	cost := int64(n) * cfg.Interval
	ref, mode := b.now()
	var buf [8]any
	args := append(b.common(buf[:0], ref, mode), b.boxCost(cost), tau, "0")
	v, err := b.eval(ctx, gcraScript, []string{b.prefix + key}, args)
	if err != nil {
		return b.fail(ctx, key, n, err)
	}
	debt, ok := v.(int64)
	if !ok {
		return b.fail(ctx, key, n, b.failed(ctx, fmt.Errorf("unexpected reply %T", v)))
	}
	if debt < 0 {
		return cfg.Decision(0, -1-debt, cost, false), nil
	}
	return cfg.Decision(0, debt, cost, true), nil
}

// Quota reports the burst and the time to refill it from empty.
func (b *Bucket) Quota() throttle.Quota {
	return throttle.Quota{Limit: b.cfg.Burst, Window: b.cfg.Rate.Duration(int64(b.cfg.Burst))}
}

// AllowQuota is Allow under a limit given with the call, rate and burst,
// instead of the bucket's own, as go-redis/redis_rate takes it: one Bucket
// serves keys of different tiers. A key keeps what it has used when its
// limit changes, read under the new limit (its state is the instant it is
// full again). With leasing, these calls go to Redis each time. Errors
// wrap throttle.ErrInvalid (a bad key, n, rate or burst, or a span above
// 2^52 ns, about 52 days), throttle.ErrExceedsLimit (n > burst) or
// throttle.ErrUnavailable.
func (b *Bucket) AllowQuota(ctx context.Context, key string, n int, rate throttle.Rate, burst int) (throttle.Decision, error) {
	start := b.report.Start()
	d, err := b.allowQuota(ctx, key, n, rate, burst)
	b.report.Call(limiterkit.MethodAllowQuota, key, n, d, err, start)
	return d, err
}

func (b *Bucket) allowQuota(ctx context.Context, key string, n int, rate throttle.Rate, burst int) (throttle.Decision, error) {
	var cfg gcra.Config
	if err := cfg.Set(rate, burst); err != nil {
		return throttle.Decision{}, err
	}
	if err := checkSpan(&cfg); err != nil {
		return throttle.Decision{}, err
	}
	if b.closed.Load() {
		return throttle.Decision{}, throttle.ErrClosed
	}
	if err := b.settings.CheckKey(key); err != nil {
		return throttle.Decision{}, err
	}
	if err := limiterkit.CheckN(n, burst); err != nil {
		return throttle.Decision{}, err
	}
	return b.decide(ctx, key, n, &cfg, cfg.Tau)
}

// boxCost returns cost as an argument, without allocating for n = 1.
func (b *Bucket) boxCost(cost int64) any {
	if cost == b.cfg.Interval {
		return b.cost1
	}
	return cost
}

// take books cost under key if the new TAT is within limit of now,
// returning {1, debt, TAT} or {0, debt}.
func (b *Bucket) take(ctx context.Context, key string, cost int64, limit any) ([]any, error) {
	ref, mode := b.now()
	var buf [8]any
	args := append(b.common(buf[:0], ref, mode), b.boxCost(cost), limit, "1")
	return b.run(ctx, gcraScript, []string{b.prefix + key}, args)
}

// Reserve books n units for key at the earliest instant they fit across
// every process sharing the key, unless that is more than maxWait away;
// then nothing is booked, OK is false and Delay says how much later the
// same reservation would fit. Cancel gives the booking back if nothing
// was booked behind it since. When Redis is unavailable, Reserve returns
// an error wrapping throttle.ErrUnavailable under every failure policy
// except failsafe.Open, which grants a reservation without delay.
func (b *Bucket) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return b.report.Reserve(ctx, key, n, maxWait, b.reserve)
}

func (b *Bucket) reserve(ctx context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	if err := b.check(key, n); err != nil {
		return throttle.Reservation{}, err
	}
	if maxWait < 0 {
		return throttle.Reservation{}, fmt.Errorf("%w: negative maxWait %v", throttle.ErrInvalid, maxWait)
	}
	cost := int64(n) * b.cfg.Interval
	limit := min(b.cfg.Limit(maxWait), int64(maxSpan)) // bookings stay exact
	r, err := b.take(ctx, key, cost, limit)
	if err != nil {
		if !errorsIsUnavailable(err) {
			return throttle.Reservation{Limit: b.limit}, err
		}
		open := b.policy == failsafe.Open
		d := throttle.Decision{Allowed: open, Limit: b.limit}
		if open {
			d.Remaining = b.limit - n
		}
		b.observe(throttle.Event{Kind: throttle.EventFallback, Key: key, N: n, Err: err, Decision: d})
		if open {
			return limiterkit.NewReservation(0, b.limit, nil), nil
		}
		return throttle.Reservation{Limit: b.limit}, err
	}
	debt := integer(r[1])
	if integer(r[0]) != 1 {
		return throttle.Reservation{Delay: time.Duration(debt + cost - limit), Limit: b.limit}, nil
	}
	booked, _ := r[2].(string)
	delay := time.Duration(max(debt-b.cfg.Tau, 0))
	return limiterkit.NewReservation(delay, b.limit, func() { b.refund(key, booked, cost) }), nil
}

// refund gives a booking back (best effort, bounded by the timeout).
func (b *Bucket) refund(key, booked string, cost int64) {
	if booked == "" || b.closed.Load() {
		return
	}
	ref, _ := b.now()
	var buf [8]any
	args := append(b.common(buf[:0], ref, "0"), booked, cost)
	_, _ = b.run(context.Background(), refundScript, []string{b.prefix + key}, args)
}
