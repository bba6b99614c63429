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
// Pacer: slots are exactly rate.Duration(1) apart; with slack s, after an
// idle spell at most s+1 slots are granted at once (the current one plus
// s missed ones as catch-up), and over any interval of length d at most
// s + 1 + rate.Events(d) slots start.
//
// The meter is mathematically the same algorithm as the token bucket of
// package tokenbucket (GCRA): the level here is capacity minus the tokens
// there, and the two packages share one implementation. Units cost
// rate.Duration(1), rounded up to a whole nanosecond when the period is not
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
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

// The method sets this package shares with tokenbucket, which runs the
// same GCRA and differs only in its names.
type (
	bucket  = gcra.Bucket
	limiter = gcra.Limiter
)

// Bucket is a single leaky bucket (meter) guarding one resource. All
// methods are safe for concurrent use. The zero value is not usable: its
// methods fail with an error wrapping throttle.ErrInvalid; create it with
// NewBucket.
//
// Its methods:
//   - AllowN(n) pours n units in if they fit now. In the Decision, Limit is
//     the capacity, Remaining the free capacity left, RetryAfter the exact
//     time until n units fit, ResetAfter the time until the bucket is empty.
//     Errors: n <= 0 wraps ErrInvalid, n > capacity wraps ErrExceedsLimit.
//     Allow(ctx, key, n) is AllowN(n), ignoring ctx and key.
//   - ReserveN(n, maxWait) books room for n units at the earliest instant
//     they fit, provided that is at most maxWait from now, in arrival order.
//     Cancel on the Reservation takes the units out again if nothing was
//     poured in since; otherwise it does nothing. Reserve(ctx, key, n,
//     maxWait) is ReserveN, ignoring ctx and key.
//   - Debit(n) pours n units in without checking; the level may exceed the
//     capacity (up to about 73 years of drain). n <= 0 fails with
//     ErrInvalid.
//   - SetRate(r) changes the drain rate, keeping the instant at which the
//     bucket is empty (see the package documentation); Rate() returns it
//     (the zero Rate on a zero Bucket). Errors wrap ErrInvalid.
//   - Quota() reports the capacity and the time to drain it.
type Bucket struct{ bucket }

// NewBucket returns an empty bucket of the given capacity draining at
// rate. The only Option it reads is WithClock. Errors wrap
// throttle.ErrInvalid: an invalid rate, capacity <= 0, or
// capacity·rate.Duration(1) above 36 years.
func NewBucket(rate throttle.Rate, capacity int, opts ...throttle.Option) (*Bucket, error) {
	b := new(Bucket)
	if err := gcra.InitBucket(&b.bucket, rate, capacity, opts); err != nil {
		return nil, err
	}
	return b, nil
}

// Level returns the units in the bucket now, rounded up: 0 when empty,
// above the capacity after debits. A request of n fits now when
// Level()+n <= Capacity(), unless someone else pours in meanwhile.
func (b *Bucket) Level() int64 { return gcra.SingleOf(&b.bucket).Level() }

// SetCapacity changes the capacity, keeping the level. Errors wrap
// ErrInvalid.
func (b *Bucket) SetCapacity(capacity int) error { return gcra.SingleOf(&b.bucket).SetBurst(capacity) }

// Capacity returns the capacity (0 on a zero Bucket).
func (b *Bucket) Capacity() int { return gcra.BurstOf(gcra.SingleOf(&b.bucket).Config()) }

// Limiter is a set of leaky buckets (meters), one per key, all with the
// same rate and capacity. A key seen for the first time starts empty; a
// key whose bucket is empty again is forgotten (no accuracy is lost), and
// past throttle.WithMaxKeys a key not used recently (CLOCK) is evicted,
// leaving its level as a debt that it (or a key sharing its cell of the
// debt table) starts from. A key takes about 42 bytes, as in
// tokenbucket.Limiter. All methods are safe for concurrent use.
// The zero value is not usable: its methods fail with an error wrapping
// throttle.ErrInvalid; create it with New.
//
// Its methods, per key, are those of Bucket: Allow (errors wrap
// ErrInvalid for a bad key or n, ErrExceedsLimit for n > capacity, or
// ErrClosed), Reserve, Debit, SetRate and Rate, and Quota, all ignoring
// ctx; SetRate changes every key. Len returns the number of keys tracked
// (keys whose bucket has drained are dropped lazily, so it may count some
// of them). Close stops the background sweeper, if any; later calls to
// Allow, Reserve and Debit fail with ErrClosed; Close is idempotent.
type Limiter struct{ limiter }

// New returns a keyed limiter of buckets of the given capacity draining
// at rate. Errors wrap throttle.ErrInvalid. If the options start a
// sweeper (WithSweepInterval), Close stops it.
func New(rate throttle.Rate, capacity int, opts ...throttle.Option) (*Limiter, error) {
	l := new(Limiter)
	if err := gcra.InitLimiter(&l.limiter, rate, capacity, opts); err != nil {
		return nil, err
	}
	return l, nil
}

// Level returns the units in key's bucket now (0 for an unknown key); see
// Bucket.Level.
func (l *Limiter) Level(key string) int64 { return gcra.KeyedOf(&l.limiter).Level(key) }

// SetCapacity changes the capacity of every key; see Bucket.SetCapacity.
func (l *Limiter) SetCapacity(capacity int) error { return gcra.KeyedOf(&l.limiter).SetBurst(capacity) }

// Capacity returns the capacity (0 on a zero Limiter).
func (l *Limiter) Capacity() int { return gcra.BurstOf(gcra.KeyedOf(&l.limiter).Config()) }
