package gcra

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
)

// Bucket is the part of tokenbucket.Bucket and leakybucket.Bucket that
// their two vocabularies (tokens free, units poured in) share; each
// embeds it and adds its own names for the state and the burst. The
// methods are documented for both in the packages' type comments. Safe
// for concurrent use; the zero value fails with throttle.ErrInvalid.
type Bucket struct{ s Single }

// InitBucket makes b a bucket of rate and burst; see Single.Init.
func InitBucket(b *Bucket, rate throttle.Rate, burst int, opts []throttle.Option) error {
	return b.s.Init(rate, burst, opts...)
}

// SingleOf returns the Single behind b, for the methods the two
// vocabularies name differently.
func SingleOf(b *Bucket) *Single { return &b.s }

// AllowN admits n units now or denies them.
func (b *Bucket) AllowN(n int) (d throttle.Decision, err error) {
	err = b.s.AllowN(&d, n)
	return d, err
}

// Allow is AllowN(n); it ignores ctx and key.
func (b *Bucket) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = b.s.AllowN(&d, n)
	return d, err
}

// ReserveN books n units at the earliest instant they fit, if within
// maxWait.
func (b *Bucket) ReserveN(n int, maxWait time.Duration) (throttle.Reservation, error) {
	return b.s.Reserve(n, maxWait)
}

// Reserve is ReserveN(n, maxWait); it ignores ctx and key.
func (b *Bucket) Reserve(_ context.Context, _ string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return b.s.Reserve(n, maxWait)
}

// Debit charges n units without checking.
func (b *Bucket) Debit(n int64) error { return b.s.Debit(n) }

// SetRate changes the rate, keeping the TAT.
func (b *Bucket) SetRate(r throttle.Rate) error { return b.s.SetRate(r) }

// Rate returns the current rate (the zero Rate on a zero Bucket).
func (b *Bucket) Rate() throttle.Rate { return RateOf(b.s.Config()) }

// Quota reports the burst and the time to earn it from nothing; it
// follows SetRate and the burst's setter.
func (b *Bucket) Quota() throttle.Quota { return QuotaOf(b.s.Config()) }

// Limiter is the part of tokenbucket.Limiter and leakybucket.Limiter that
// their two vocabularies share, as Bucket is for the single buckets.
type Limiter struct{ k Keyed }

// InitLimiter makes l a keyed limiter of rate and burst; see Keyed.Init.
func InitLimiter(l *Limiter, rate throttle.Rate, burst int, opts []throttle.Option) error {
	return l.k.Init(rate, burst, opts...)
}

// KeyedOf returns the Keyed behind l, for the methods the two
// vocabularies name differently.
func KeyedOf(l *Limiter) *Keyed { return &l.k }

// Allow admits n units for key now or denies them. It ignores ctx.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	err = l.k.Allow(&d, key, n)
	return d, err
}

// Reserve books n units of key's bucket at the earliest instant they
// fit, if within maxWait. It ignores ctx.
func (l *Limiter) Reserve(_ context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return l.k.Reserve(key, n, maxWait)
}

// Debit charges n units to key without checking.
func (l *Limiter) Debit(key string, n int64) error { return l.k.Debit(key, n) }

// SetRate changes the rate of every key, keeping their TATs.
func (l *Limiter) SetRate(r throttle.Rate) error { return l.k.SetRate(r) }

// Rate returns the current rate (the zero Rate on a zero Limiter).
func (l *Limiter) Rate() throttle.Rate { return RateOf(l.k.Config()) }

// Quota reports the burst and the time to earn it from nothing.
func (l *Limiter) Quota() throttle.Quota { return QuotaOf(l.k.Config()) }

// Len returns the number of keys tracked, some of them possibly idle
// (dropped lazily).
func (l *Limiter) Len() int {
	if m := l.k.Map(); m != nil {
		return m.Len()
	}
	return 0
}

// Close stops the background sweeper, if any; later calls to Allow,
// Reserve and Debit fail with ErrClosed. Close is idempotent.
func (l *Limiter) Close() error { return l.k.Close() }

// RateOf is c's rate, the zero Rate for a nil c.
func RateOf(c *Config) throttle.Rate {
	if c == nil {
		return throttle.Rate{}
	}
	return c.Rate
}

// BurstOf is c's burst, 0 for a nil c.
func BurstOf(c *Config) int {
	if c == nil {
		return 0
	}
	return c.Burst
}

// QuotaOf is c's burst and the time to earn it, zero for a nil c.
func QuotaOf(c *Config) throttle.Quota {
	if c == nil {
		return throttle.Quota{}
	}
	return throttle.Quota{Limit: c.Burst, Window: c.Rate.Duration(int64(c.Burst))}
}
