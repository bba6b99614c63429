package storelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/lease"
)

// defaultLeaseAge is how long leased units stay spendable when
// NewLeasing is given a maxAge of 0.
const defaultLeaseAge = 100 * time.Millisecond

// NewLeasing returns a Limiter as New does, that leases units: it takes
// up to maxBatch units of a key from the store in one read-decide-swap
// (charging them there, as that many admissions) and spends them locally,
// lock-free, refilling in the background when half a batch is spent, so
// a key in demand costs the store one statement or two per batch rather
// than per round. The batch adapts to demand: it doubles (up to maxBatch,
// at most the limit) when the pool ran dry and a caller waited for the
// store, and halves when leased units expired unspent. Leased units are
// spendable for maxAge (0 means 100 ms), then dropped. A denial
// is decided locally while, as of the last lease, the key cannot grant
// half a batch and could grant the request for less than maxAge/8: a hot
// key over its limit costs the store at most one statement per half batch
// or per maxAge/8, and holds at most what accrues in maxAge/8 beyond the
// request while its callers are denied. Close ends the background
// refills.
//
// Bound: every leased unit is charged in the store, so across every
// process the units admitted are never more than the Algorithm admits
// over the store; leasing moves admissions later by at most maxAge. The
// units admitted in any interval of length d are at most what the
// Algorithm admits in d + maxAge (for a token bucket, burst +
// Events(d + maxAge)); from a key's fresh start, exactly its limit. What
// is lost is under-admission: units leased but not spent before maxAge
// (the next lease gives them back, exactly, unless another process wrote
// the key since), and those a process holds when it crashes or its
// lease's reply is lost (at most two batches per process and key). Decisions are
// approximate in Remaining (the local pool) and ResetAfter (as of the
// last lease). Errors are New's, and ErrInvalid for maxBatch < 1 or
// maxAge < 0.
func NewLeasing(s Store, a Algorithm, maxBatch int, maxAge time.Duration, opts ...throttle.Option) (*Limiter, error) {
	if maxBatch < 1 || maxAge < 0 {
		return nil, fmt.Errorf("%w: storelimit.NewLeasing(%d, %v)", throttle.ErrInvalid, maxBatch, maxAge)
	}
	l, err := New(s, a, opts...)
	if err != nil {
		return nil, err
	}
	if maxAge == 0 {
		maxAge = defaultLeaseAge
	}
	l.lease = lease.New(taker{l}, lease.Config{
		MaxBatch: int64(min(maxBatch, l.limit)),
		MaxAge:   int64(maxAge),
		MaxKeys:  l.keys.MaxKeys,
		Timeout:  int64(l.timeout),
		Limit:    l.limit,
		Now:      l.clk.Now,
	})
	return l, nil
}

// Close makes further calls fail with an error wrapping throttle.ErrClosed
// and ends the background refills of a leasing Limiter, waiting for them.
// The units it still holds are lost (as when a process ends). It returns
// nil.
func (l *Limiter) Close() error {
	if l == nil {
		return nil
	}
	l.closed.Store(true)
	if l.lease != nil {
		l.lease.Close()
	}
	return nil
}

// taker leases units of a Limiter's keys from its store: the store side
// of the shared leasing (internal/lease). A state is the stored state.
type taker struct{ l *Limiter }

// Take charges between need and want units of key at now in one
// read-decide-swap, the most the key's state admits, after giving back
// what back returns when the key's state is still the one it names.
func (t taker) Take(ctx context.Context, key string, now, want, need int64, back lease.Return) (lease.Grant, error) {
	l := t.l
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	var g lease.Grant
	err := l.update(ctx, key, maphash.String(l.seed, key), now, func(old int64) (int64, time.Duration, bool) {
		base := old
		if back.Units > 0 && old == back.After {
			base = l.rebase(back, old)
		}
		var reset time.Duration
		g, reset = l.grant(base, now, want, need)
		if g.Units == 0 {
			reset = time.Duration(max(g.ResetAt-now, 0)) // base stored, if given back
		}
		return g.State, reset, g.State != old
	})
	return g, err
}

// rebase returns the state the lease back names would have left had it
// granted only back.Kept units, or old if the Algorithm says otherwise.
func (l *Limiter) rebase(back lease.Return, old int64) int64 {
	if back.Kept == 0 {
		return back.Before
	}
	next, d, err := l.a.Decide(back.Before+l.fresh, back.At, int(back.Kept))
	if err != nil || !d.Allowed {
		return old
	}
	return next - l.fresh
}

// grant decides a lease of between need and want units on state old at
// now: the most of want the state admits, or none below need.
func (l *Limiter) grant(old, now, want, need int64) (lease.Grant, time.Duration) {
	k := want
	next, d, err := l.a.Decide(old+l.fresh, now, int(k))
	if err != nil || !d.Allowed {
		k = min(want, int64(d.Remaining))
		if k < need {
			return lease.Grant{State: old, Before: old, ResetAt: now + int64(d.ResetAfter)}, 0
		}
		if next, d, err = l.a.Decide(old+l.fresh, now, int(k)); err != nil || !d.Allowed {
			return lease.Grant{State: old, Before: old, ResetAt: now + int64(d.ResetAfter)}, 0
		}
	}
	return lease.Grant{Units: k, State: next - l.fresh, Before: old, ResetAt: now + int64(d.ResetAfter)}, d.ResetAfter
}

// Ready is the instant a key in state admits units, as the Algorithm
// says: now, or after the denial's RetryAfter.
func (t taker) Ready(state, now, units int64) int64 {
	_, d, err := t.l.a.Decide(state+t.l.fresh, now, int(units))
	if err != nil || d.Allowed {
		return now
	}
	return now + int64(d.RetryAfter)
}
