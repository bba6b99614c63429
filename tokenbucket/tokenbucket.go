// Package tokenbucket is a token bucket rate limiter: a bucket holds up to
// burst tokens, refills at rate, and a request of n units takes n tokens or
// is denied.
//
//	l, err := tokenbucket.New(throttle.PerSecond(100), 10) // per key: 100/s, bursts of 10
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	d, err := l.Allow(ctx, apiKey, 1) // d.Allowed, d.Remaining, d.RetryAfter
//
// It is implemented as GCRA (the Generic Cell Rate Algorithm): the whole
// state of a bucket is one int64, the instant at which it is full again
// (the theoretical arrival time, TAT), updated by one compare-and-swap. No
// mutex, no allocation, one clock read per decision; there are no refill
// ticks and no floating point.
//
// # Guarantees
//
// Over any interval of length d, starting from any state, a bucket admits
// at most burst + rate.Events(d) units — e.g. with PerSecond(100) and burst
// 10, at most 110 units in any second and 10 at any single instant. A full
// bucket admits exactly burst units at one instant. Decisions are exact to
// the nanosecond: a denied request retried RetryAfter later succeeds (if
// nothing else was admitted meanwhile) and retried 1 ns sooner fails.
//
// Every unit costs rate.Duration(1), a whole number of nanoseconds. When the
// rate's period is not a multiple of its count (PerSecond(3) is 333333333.3
// ns per unit), the interval is rounded up: the bucket then refills at most
// 1 ns per unit slower than the nominal rate, never faster, so the bound
// above still holds.
//
// # Run-time changes and external debits
//
// SetRate and SetBurst change a live bucket without resetting it: the TAT,
// the instant at which the bucket is full again, is kept. So after
// SetBurst the tokens in use stay in use; after SetRate the debt in time
// (TAT - now) is kept and re-read at the new rate: raising the rate makes
// the same debt cover more tokens, lowering it fewer, and the bucket is
// full again at the same instant either way. From the change on, the bound
// above holds with the new values, as for a fresh bucket.
//
// Debit charges units that were used elsewhere (reported by a peer, say)
// without checking: the bucket may go below empty, and Tokens turns
// negative until the debt is earned back at rate.
//
// # Time range
//
// A clock may read any instant int64 nanoseconds hold, 1677 to 2262,
// before 1970 too. A decision whose bucket would be full again only after
// 2262-04-11 23:47:16 (the end of that range) fails with an error wrapping
// throttle.ErrInvalid instead of wrapping around; so, for instance, a
// bucket of 36 tokens at one per 366 days admits 12 in 2250, then fails.
package tokenbucket

import (
	"context"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

// The method sets this package shares with leakybucket, which runs the
// same GCRA and differs only in its names.
type (
	bucket  = gcra.Bucket
	limiter = gcra.Limiter
)

// Bucket is a single token bucket guarding one resource. All methods are
// safe for concurrent use. The zero value is not usable: its methods fail
// with an error wrapping throttle.ErrInvalid; create it with NewBucket.
//
// Its methods:
//   - AllowN(n) takes n tokens if the bucket holds them now, and reports
//     the outcome: Remaining is the whole tokens left, RetryAfter the exact
//     wait until n tokens are there, ResetAfter the time until the bucket is
//     full. Errors: n <= 0 wraps ErrInvalid, n > burst wraps
//     ErrExceedsLimit. Allow(ctx, key, n) is AllowN(n), ignoring ctx and key.
//   - ReserveN(n, maxWait) books n tokens at the earliest instant the bucket
//     holds them, provided that is at most maxWait from now; reservations
//     are served in arrival order. Cancel on the Reservation gives the
//     tokens back if no later reservation or admission was made since;
//     otherwise it does nothing (the tokens are consumed, as if the work had
//     been done). Reserve(ctx, key, n, maxWait) is ReserveN, ignoring ctx
//     and key.
//   - Debit(n) takes n tokens without checking, letting the bucket go below
//     empty (down to about 73 years of debt). n <= 0 fails with ErrInvalid.
//   - SetRate(r) changes the refill rate, keeping the instant at which the
//     bucket is full (see the package documentation); Rate() returns it (the
//     zero Rate on a zero Bucket). Errors wrap ErrInvalid.
//   - Quota() reports the burst and the time to refill it from empty; it
//     follows SetRate and SetBurst.
type Bucket struct{ bucket }

// NewBucket returns a full bucket of burst tokens refilled at rate. The
// only Options it reads is WithClock. Errors wrap throttle.ErrInvalid: an
// invalid rate, burst <= 0, or burst·rate.Duration(1) above 36 years.
func NewBucket(rate throttle.Rate, burst int, opts ...throttle.Option) (*Bucket, error) {
	b := new(Bucket)
	if err := gcra.InitBucket(&b.bucket, rate, burst, opts); err != nil {
		return nil, err
	}
	return b, nil
}

// Tokens returns the whole tokens in the bucket now: burst when full,
// negative after debits took it below empty. It is floor of the exact
// fractional count, so AllowN(Tokens()) succeeds when Tokens() > 0 and no
// one else takes tokens meanwhile.
func (b *Bucket) Tokens() int64 { return gcra.SingleOf(&b.bucket).Tokens() }

// SetBurst changes the capacity, keeping the tokens in use. Errors wrap
// ErrInvalid.
func (b *Bucket) SetBurst(burst int) error { return gcra.SingleOf(&b.bucket).SetBurst(burst) }

// Burst returns the current capacity (0 on a zero Bucket).
func (b *Bucket) Burst() int { return gcra.BurstOf(gcra.SingleOf(&b.bucket).Config()) }

// Limiter is a set of token buckets, one per key, all with the same rate
// and burst. A key seen for the first time starts full; a key whose
// bucket is full again is forgotten (no accuracy is lost), and past
// throttle.WithMaxKeys a key not used recently (CLOCK) is evicted, leaving
// what it owes as a debt that it (or a key sharing its cell of the debt
// table) starts from, so eviction never refills a bucket. A key takes
// about 42 bytes: its 8-byte state and two hashes of the key (the key
// itself is not kept) in a table slot. All methods are safe for
// concurrent use. The zero value is not usable: its methods fail with an
// error wrapping throttle.ErrInvalid; create it with New.
//
// Its methods, per key, are those of Bucket: Allow (errors wrap
// ErrInvalid for a bad key or n, ErrExceedsLimit for n > burst, or
// ErrClosed), Reserve, Debit, SetRate and Rate, and Quota, all ignoring
// ctx; SetRate changes every key. Len returns the number of keys tracked
// (keys whose bucket is full again are dropped lazily, so it may count
// some of them). Close stops the background sweeper, if any; later calls
// to Allow, Reserve and Debit fail with ErrClosed; Close is idempotent.
type Limiter struct{ limiter }

// New returns a keyed limiter of buckets of burst tokens refilled at
// rate. Errors wrap throttle.ErrInvalid. If the options start a sweeper
// (WithSweepInterval), Close stops it.
func New(rate throttle.Rate, burst int, opts ...throttle.Option) (*Limiter, error) {
	l := new(Limiter)
	if err := gcra.InitLimiter(&l.limiter, rate, burst, opts); err != nil {
		return nil, err
	}
	return l, nil
}

// Tokens returns the whole tokens in key's bucket now (burst for an
// unknown key, negative below empty); see Bucket.Tokens.
func (l *Limiter) Tokens(key string) int64 { return gcra.KeyedOf(&l.limiter).Tokens(key) }

// SetBurst changes the capacity of every key; see Bucket.SetBurst.
func (l *Limiter) SetBurst(burst int) error { return gcra.KeyedOf(&l.limiter).SetBurst(burst) }

// Burst returns the current capacity (0 on a zero Limiter).
func (l *Limiter) Burst() int { return gcra.BurstOf(gcra.KeyedOf(&l.limiter).Config()) }

// AllowQuota is Allow under a limit given with the call, rate and burst,
// instead of the limiter's own: one Limiter can serve keys of different
// tiers. A key keeps what it has used when its limit changes, read under
// the new limit (as after SetRate and SetBurst). Errors wrap
// throttle.ErrInvalid (a bad key, n, rate or burst) or
// throttle.ErrExceedsLimit (n > burst).
func (l *Limiter) AllowQuota(_ context.Context, key string, n int, rate throttle.Rate, burst int) (d throttle.Decision, err error) {
	err = gcra.KeyedOf(&l.limiter).AllowWith(&d, key, n, rate, burst)
	return d, err
}
