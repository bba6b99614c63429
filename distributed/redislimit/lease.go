package redislimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// Defaults of token leasing.
const (
	// DefaultLeaseAge is how long leased tokens stay spendable.
	DefaultLeaseAge = 100 * time.Millisecond
)

// WithLeasing makes a token bucket (NewTokenBucket, NewEvery) lease
// tokens: each process takes up to maxBatch units from Redis per round
// trip and spends them locally, refilling in the background before it
// runs dry, so most decisions need no network. The batch adapts to
// demand: it doubles (up to maxBatch) when the local pool ran dry and a
// caller had to wait for Redis, and halves when leased tokens expired
// unspent. Leased tokens are spendable for maxAge (0 means
// DefaultLeaseAge), then dropped: never carried over.
//
// Every leased token is taken from the shared bucket, so over any long
// run the units admitted never exceed the bucket's limit. Leasing only
// moves admissions later in time, by at most maxAge: the units admitted
// in any interval of length d are at most burst + Events(d + maxAge) of
// the rate, and also at most burst + Events(d) + 2·maxBatch·P for P
// processes (each holds at most two batches per key): that is the
// worst-case overshoot. A denial is cached locally until the bucket can
// next grant a unit, so denials need no network either.
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
			maxAge = DefaultLeaseAge
		}
		c.lease = &leaseConfig{maxBatch: int64(maxBatch), maxAge: int64(maxAge)}
	}
}

type leaseConfig struct {
	maxBatch int64
	maxAge   int64
}

// leaser is the local side of token leasing for one Bucket.
type leaser struct {
	b        *Bucket
	maxBatch int64
	maxAge   int64

	pools  sync.Map // key -> *pool
	npools atomic.Int64

	bg     context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	trips  atomic.Int64 // round trips, for tests and metrics
	closed atomic.Bool
}

// pool is what one process holds for one key.
type pool struct {
	cur, prev atomic.Pointer[batch]
	size      atomic.Int64 // next batch size
	base      atomic.Int64 // local instant at which the bucket, as of the last round trip, held 0 units
	resetAt   atomic.Int64 // local instant when the bucket is full, as of the last round trip
	refilling atomic.Bool
	mu        sync.Mutex // serializes synchronous refills
}

// batch is a lease: tokens spendable until expires.
type batch struct {
	left    atomic.Int64
	expires int64
}

func (b *Bucket) initLease(cfg *config) error {
	if cfg.lease == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &leaser{b: b, maxBatch: min(cfg.lease.maxBatch, int64(b.cfg.Burst)), maxAge: cfg.lease.maxAge, bg: ctx, stop: cancel}
	b.lease = l
	b.closers = append(b.closers, l.close)
	return nil
}

func (l *leaser) close() {
	l.closed.Store(true)
	l.stop()
	l.wg.Wait()
}

// RoundTrips returns how many round trips to Redis the token leasing of b
// has made (0 without leasing).
func (b *Bucket) RoundTrips() int64 {
	if b.lease == nil {
		return 0
	}
	return b.lease.trips.Load()
}

func (l *leaser) pool(key string, now int64) *pool {
	if p, ok := l.pools.Load(key); ok {
		return p.(*pool)
	}
	if l.npools.Load() >= int64(l.b.settings.MaxKeys) {
		l.sweep(now)
	}
	p := new(pool)
	p.size.Store(min(8, l.maxBatch))
	if q, loaded := l.pools.LoadOrStore(key, p); loaded {
		return q.(*pool)
	}
	l.npools.Add(1)
	return p
}

// sweep drops the pools that hold no live token.
func (l *leaser) sweep(now int64) {
	l.pools.Range(func(k, v any) bool {
		p := v.(*pool)
		if c := p.cur.Load(); (c == nil || c.expires <= now || c.left.Load() == 0) && !p.refilling.Load() {
			if l.pools.CompareAndDelete(k, v) {
				l.npools.Add(-1)
			}
		}
		return true
	})
}

// spend takes n units from a live batch of p.
func (p *pool) spend(now, n int64) (left int64, ok bool) {
	for _, bp := range [2]*atomic.Pointer[batch]{&p.prev, &p.cur} {
		b := bp.Load()
		if b == nil || now >= b.expires {
			continue
		}
		for {
			v := b.left.Load()
			if v < n {
				break
			}
			if b.left.CompareAndSwap(v, v-n) {
				return v - n, true
			}
		}
	}
	return 0, false
}

func (l *leaser) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	b := l.b
	now := b.clk.Now()
	p := l.pool(key, now)
	if left, ok := p.spend(now, int64(n)); ok {
		if 2*left < p.size.Load() {
			l.refillAsync(key, p)
		}
		return l.allowed(p, now, left), nil
	}
	if d, denied := l.cachedDenial(p, now, n); denied {
		return d, nil
	}
	// The pool ran dry while there is demand: grow the batch and wait.
	p.mu.Lock()
	defer p.mu.Unlock()
	if left, ok := p.spend(now, int64(n)); ok { // another caller refilled
		return l.allowed(p, now, left), nil
	}
	if s := p.size.Load(); s < l.maxBatch {
		p.size.Store(min(2*s, l.maxBatch))
	}
	granted, err := l.refill(ctx, key, p, now, int64(n))
	if err != nil {
		return b.fail(ctx, key, n, err)
	}
	if granted == 0 {
		d, _ := l.cachedDenial(p, now, n)
		return d, nil
	}
	left, _ := p.spend(now, int64(n))
	return l.allowed(p, now, left), nil
}

func (l *leaser) allowed(p *pool, now, left int64) throttle.Decision {
	return throttle.Decision{
		Allowed:    true,
		Limit:      l.b.limit,
		Remaining:  int(min(left, int64(l.b.limit))),
		ResetAfter: time.Duration(max(p.resetAt.Load()-now, 0)),
	}
}

// cachedDenial denies n units locally while, as of the last round trip,
// the bucket cannot have accrued max(n, half a batch) units: a round trip
// then brings several units instead of one, over the limit as below it.
func (l *leaser) cachedDenial(p *pool, now int64, n int) (throttle.Decision, bool) {
	at := p.base.Load() + max(int64(n), l.threshold(p))*l.b.cfg.Interval
	if now >= at {
		return throttle.Decision{}, false
	}
	return throttle.Decision{
		Limit:      l.b.limit,
		RetryAfter: time.Duration(at - now),
		ResetAfter: time.Duration(max(p.resetAt.Load()-now, 0)),
	}, true
}

// threshold is how many units must have accrued in the bucket before a
// background refill is worth a round trip: half a batch.
func (l *leaser) threshold(p *pool) int64 { return (p.size.Load() + 1) / 2 }

// refill leases a batch of p.size units (at least need) for key and
// installs it. It returns how many units were granted.
func (l *leaser) refill(ctx context.Context, key string, p *pool, now, need int64) (int64, error) {
	b := l.b
	want := max(p.size.Load(), need)
	if c := p.cur.Load(); c != nil && c.expires <= now && c.left.Load() > 0 {
		p.size.Store(max(p.size.Load()/2, 1)) // tokens expired unspent: lease less
	}
	ref, mode := b.now()
	var buf [9]any
	args := append(b.common(buf[:0], ref, mode), b.cost1, b.tau, want, need)
	l.trips.Add(1)
	r, err := b.run(ctx, leaseScript, []string{b.prefix + key}, args)
	if err != nil {
		return 0, err
	}
	granted, debt := integer(r[0]), integer(r[1])
	p.resetAt.Store(now + debt)
	p.base.Store(now + debt - b.cfg.Tau)
	if granted == 0 {
		return 0, nil
	}
	nb := &batch{expires: now + l.maxAge}
	nb.left.Store(granted)
	p.prev.Store(p.cur.Swap(nb))
	return granted, nil
}

// refillAsync refills p in the background unless a refill is running.
func (l *leaser) refillAsync(key string, p *pool) {
	if l.closed.Load() || !p.refilling.CompareAndSwap(false, true) {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer p.refilling.Store(false)
		if l.closed.Load() {
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		now := l.b.clk.Now()
		if now < p.base.Load()+l.threshold(p)*l.b.cfg.Interval {
			return // too little accrued: a later spend asks again
		}
		_, _ = l.refill(l.bg, key, p, now, 1)
	}()
}

func errorsIsUnavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }
