package redislimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/lease"
)

// Defaults of token leasing.
const (
	// defaultLeaseAge is how long leased tokens stay spendable.
	defaultLeaseAge = 100 * time.Millisecond
)

// WithLeasing makes a token bucket (NewTokenBucket) lease
// tokens: each process takes up to maxBatch units from Redis per round
// trip and spends them locally, refilling in the background before it
// runs dry, so most decisions need no network. The batch adapts to
// demand: it doubles (up to maxBatch) when the local pool ran dry and a
// caller had to wait for Redis, and halves when leased tokens expired
// unspent. Leased tokens are spendable for maxAge (0 means
// 100 ms), then dropped: never carried over.
//
// Every leased token is taken from the shared bucket, so over any long
// run the units admitted never exceed the bucket's limit. Leasing only
// moves admissions later in time, by at most maxAge: the units admitted
// in any interval of length d are at most burst + Events(d + maxAge) of
// the rate, and also at most burst + Events(d) + 2·maxBatch·P for P
// processes (each holds at most two batches per key): that is the
// worst-case overshoot. A denial is cached locally until, as of the last
// round trip, the bucket can grant half a batch or could grant the
// request maxAge/8 before, so denials need no network either, and a key
// over its limit holds at most maxAge/8 of its rate unleased while its
// callers are denied.
//
// Decisions with leasing are approximate in their Remaining (the local
// pool) and ResetAfter (as of the last round trip) fields. Leasing is not
// available for the other algorithms, nor with Reserve, which always
// asks Redis.
func WithLeasing(maxBatch int, maxAge time.Duration) Option {
	return func(c *config) {
		if maxBatch <= 0 || maxAge < 0 {
			c.optErr = fmt.Errorf("%w: WithLeasing(%d, %v)", throttle.ErrInvalid, maxBatch, maxAge)
			return
		}
		if maxAge == 0 {
			maxAge = defaultLeaseAge
		}
		c.lease = &leaseConfig{maxBatch: int64(maxBatch), maxAge: int64(maxAge)}
	}
}

type leaseConfig struct {
	maxBatch int64
	maxAge   int64
}

// gcraTaker leases units of a Bucket's keys with one script call: the
// store side of the shared token leasing (internal/lease). A state is the
// key's theoretical arrival time on the local clock.
type gcraTaker struct {
	b *Bucket
}

// Take runs the lease script: at least need and at most want units, or
// none. It gives nothing back: expired tokens are lost.
func (t gcraTaker) Take(ctx context.Context, key string, now, want, need int64, _ lease.Return) (lease.Grant, error) {
	b := t.b
	ref, mode := b.now()
	var buf [9]any
	args := append(b.common(buf[:0], ref, mode), b.cost1, b.tau, want, need)
	r, err := b.run(ctx, leaseScript, []string{b.prefix + key}, args)
	if err != nil {
		return lease.Grant{}, err
	}
	granted, debt := integer(r[0]), integer(r[1])
	return lease.Grant{Units: granted, State: now + debt, ResetAt: now + debt}, nil
}

// Ready is when a bucket whose arrival time is tat holds units units.
func (t gcraTaker) Ready(tat, _, units int64) int64 {
	return tat - t.b.cfg.Tau + units*t.b.cfg.Interval
}

func (b *Bucket) initLease(cfg *config) error {
	if cfg.lease == nil {
		return nil
	}
	b.lease = lease.New(gcraTaker{b}, lease.Config{
		MaxBatch: min(cfg.lease.maxBatch, int64(b.cfg.Burst)),
		MaxAge:   cfg.lease.maxAge,
		MaxKeys:  b.settings.MaxKeys,
		Limit:    b.limit,
		Now:      b.clk.Now,
	})
	b.closers = append(b.closers, b.lease.Close)
	return nil
}

// roundTrips returns how many round trips to Redis the token leasing of b
// has made (0 without leasing).
func (b *Bucket) roundTrips() int64 {
	if b.lease == nil {
		return 0
	}
	return b.lease.Takes()
}

// allowLeased decides n units of key from the leased pool, failing as the
// Bucket's policy says when a lease could not be taken.
func (b *Bucket) allowLeased(ctx context.Context, key string, n int) (throttle.Decision, error) {
	d, err := b.lease.Allow(ctx, key, n, b.clk.Now())
	if err != nil {
		return b.fail(ctx, key, n, err)
	}
	return d, nil
}

func errorsIsUnavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }
