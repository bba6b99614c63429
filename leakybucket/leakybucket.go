// Package leakybucket is the leaky bucket in its two classic forms.
//
//	meter, err := leakybucket.New(throttle.PerSecond(50), 100) // per key: drains 50/s, holds 100
//	d, err := meter.Allow(ctx, key, 1)
//
//	pacer, err := leakybucket.NewPacer(throttle.PerSecond(10), 0, time.Second) // one call every 100 ms
//	err = pacer.Take(ctx) // sleeps until this caller's slot
//
// The meter (Bucket, and Limiter for one bucket per key): a bucket of
// capacity units drains continuously at rate; a request of n units is
// poured in if it fits (level + n <= capacity) and rejected otherwise —
// overflow is dropped, never queued. The level is exact, derived from one
// int64 per bucket (the instant at which the bucket is empty again),
// updated by one compare-and-swap: no mutex, no allocation, no drain
// ticks, one clock read per decision.
//
// The queue (Pacer, what go.uber.org/ratelimit does): callers are spaced
// out to exactly one per interval of rate, each one sleeping until its
// slot, in arrival order, optionally with a bounded queue.
//
// # Guarantees
//
// Meter: over any interval of length d, starting from any state, at most
// capacity + rate.Events(d) units are admitted — e.g. PerSecond(100) with
// capacity 10 lets through at most 110 units in any second and 10 at one
// instant. RetryAfter is exact to the nanosecond (the request fits at
// RetryAfter, not 1 ns sooner).
//
// Pacer: slots are exactly rate.Interval() apart; with slack s, after an
// idle spell at most s+1 slots are granted at once (the current one plus
// s missed ones as catch-up), and over any interval of length d at most
// s + 1 + rate.Events(d) slots start.
//
// The meter is mathematically the same algorithm as the token bucket of
// package tokenbucket (GCRA): the level here is capacity minus the tokens
// there, and the two packages share one implementation. Units cost
// rate.Interval(), rounded up to a whole nanosecond when the period is not
// a multiple of the count, so the bucket drains at most 1 ns per unit
// slower than the nominal rate, never faster.
//
// # Run-time changes and external debits
//
// SetRate and SetCapacity keep the instant at which the bucket is empty
// again: after SetCapacity the level is unchanged; after SetRate the
// pending drain time is kept and re-read at the new rate (a faster rate
// makes the same drain time a higher level). From the change on, the
// bound above holds with the new values. Debit pours units in without
// checking (units admitted elsewhere, reported by a peer): the level may
// exceed the capacity and drains back at rate.
package leakybucket

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

var (
	_ throttle.Limiter  = (*Bucket)(nil)
	_ throttle.Reserver = (*Bucket)(nil)
	_ throttle.Limiter  = (*Limiter)(nil)
	_ throttle.Reserver = (*Limiter)(nil)
)

// Bucket is a single leaky bucket (meter) guarding one resource. All
// methods are safe for concurrent use. The zero value is not usable: its
// methods fail with an error wrapping throttle.ErrInvalid; create it with
// NewBucket.
type Bucket struct{ g gcra.Single }

// NewBucket returns an empty bucket of the given capacity draining at
// rate. The only Option it reads is WithClock. Errors wrap
// throttle.ErrInvalid: an invalid rate, capacity <= 0, or
// capacity·rate.Interval() above 36 years.
func NewBucket(rate throttle.Rate, capacity int, opts ...throttle.Option) (*Bucket, error) {
	b := new(Bucket)
	if err := b.g.Init(rate, capacity, opts...); err != nil {
		return nil, err
	}
	return b, nil
}

// AllowN pours n units in if they fit now. In the Decision, Limit is the
// capacity, Remaining the free capacity left, RetryAfter the exact time
// until n units fit, ResetAfter the time until the bucket is empty.
// Errors: n <= 0 wraps ErrInvalid, n > capacity wraps ErrExceedsLimit.
func (b *Bucket) AllowN(n int) (d throttle.Decision, err error) {
	err = b.g.AllowN(&d, n)
	return d, err
}

// Allow is AllowN(n); it ignores ctx and key.
func (b *Bucket) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = b.g.AllowN(&d, n)
	return d, err
}

// ReserveN books room for n units at the earliest instant they fit,
// provided that is at most maxWait from now, in arrival order. Cancel on
// the Reservation takes the units out again if nothing was poured in
// since; otherwise it does nothing.
func (b *Bucket) ReserveN(n int, maxWait time.Duration) (throttle.Reservation, error) {
	return b.g.Reserve(n, maxWait)
}

// Reserve is ReserveN(n, maxWait); it ignores ctx and key.
func (b *Bucket) Reserve(_ context.Context, _ string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return b.g.Reserve(n, maxWait)
}

// Debit pours n units in without checking; the level may exceed the
// capacity (up to about 73 years of drain). n <= 0 fails with ErrInvalid.
func (b *Bucket) Debit(n int64) error { return b.g.Debit(n) }

// Level returns the units in the bucket now, rounded up: 0 when empty,
// above the capacity after debits. A request of n fits now when
// Level()+n <= Capacity(), unless someone else pours in meanwhile.
func (b *Bucket) Level() int64 { return b.g.Level() }

// SetRate changes the drain rate, keeping the instant at which the bucket
// is empty (see the package documentation). Errors wrap ErrInvalid.
func (b *Bucket) SetRate(r throttle.Rate) error { return b.g.SetRate(r) }

// SetCapacity changes the capacity, keeping the level. Errors wrap
// ErrInvalid.
func (b *Bucket) SetCapacity(capacity int) error { return b.g.SetBurst(capacity) }

// Rate returns the drain rate (the zero Rate on a zero Bucket).
func (b *Bucket) Rate() throttle.Rate {
	if c := b.g.Config(); c != nil {
		return c.Rate
	}
	return throttle.Rate{}
}

// Capacity returns the capacity (0 on a zero Bucket).
func (b *Bucket) Capacity() int {
	if c := b.g.Config(); c != nil {
		return c.Burst
	}
	return 0
}

// Limiter is a set of leaky buckets (meters), one per key, all with the
// same rate and capacity. A key seen for the first time starts empty; a
// key whose bucket is empty again is forgotten (no accuracy is lost), and
// past throttle.WithMaxKeys the least recently used key is evicted,
// leaving its level as a debt that it (or a key sharing its cell of the
// debt table) starts from. A key takes about 42 bytes, as in
// tokenbucket.Limiter. All methods are safe for concurrent use.
// The zero value is not usable: its methods fail with an error wrapping
// throttle.ErrInvalid; create it with New.
type Limiter struct{ g gcra.Keyed }

// New returns a keyed limiter of buckets of the given capacity draining
// at rate. Errors wrap throttle.ErrInvalid. If the options start a
// sweeper (WithSweepInterval), Close stops it.
func New(rate throttle.Rate, capacity int, opts ...throttle.Option) (*Limiter, error) {
	l := new(Limiter)
	if err := l.g.Init(rate, capacity, opts...); err != nil {
		return nil, err
	}
	return l, nil
}

// Allow pours n units into key's bucket if they fit now. It ignores ctx.
// See Bucket.AllowN for the Decision; errors wrap ErrInvalid (bad key or
// n), ErrExceedsLimit (n > capacity) or ErrClosed.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	err = l.g.Allow(&d, key, n)
	return d, err
}

// Reserve books room for n units in key's bucket at the earliest instant
// they fit, if within maxWait; see Bucket.ReserveN. It ignores ctx.
func (l *Limiter) Reserve(_ context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	return l.g.Reserve(key, n, maxWait)
}

// Debit pours n units into key's bucket without checking; see
// Bucket.Debit.
func (l *Limiter) Debit(key string, n int64) error { return l.g.Debit(key, n) }

// Level returns the units in key's bucket now (0 for an unknown key); see
// Bucket.Level.
func (l *Limiter) Level(key string) int64 { return l.g.Level(key) }

// SetRate changes the drain rate of every key; see Bucket.SetRate.
func (l *Limiter) SetRate(r throttle.Rate) error { return l.g.SetRate(r) }

// SetCapacity changes the capacity of every key; see Bucket.SetCapacity.
func (l *Limiter) SetCapacity(capacity int) error { return l.g.SetBurst(capacity) }

// Rate returns the drain rate (the zero Rate on a zero Limiter).
func (l *Limiter) Rate() throttle.Rate {
	if c := l.g.Config(); c != nil {
		return c.Rate
	}
	return throttle.Rate{}
}

// Capacity returns the capacity (0 on a zero Limiter).
func (l *Limiter) Capacity() int {
	if c := l.g.Config(); c != nil {
		return c.Burst
	}
	return 0
}

// Len returns the number of keys tracked. Keys whose bucket has drained
// are dropped lazily, so it may count some of them.
func (l *Limiter) Len() int {
	if m := l.g.Map(); m != nil {
		return m.Len()
	}
	return 0
}

// Close stops the background sweeper, if any. Later calls to Allow,
// Reserve and Debit fail with ErrClosed. Close is idempotent.
func (l *Limiter) Close() error { return l.g.Close() }
