// Package lease is the local side of token leasing, shared by the
// backends that lease (redislimit's buckets, storelimit's limiters): a
// process takes a batch of units of a key from the shared store in one
// call and spends them locally, lock-free, so that a key in demand costs
// the store one call per batch rather than one per decision.
//
// Every leased unit is charged in the store when it is taken, so the
// units a process admits are never more than the store granted it: over
// every process sharing the store, the units admitted are at most what
// the limit allows, moved later in time by at most the lease's age.
// Leased units a process does not spend before they expire are given back
// by its next Take when the key's state is still the one their lease left
// (a Taker may not support it), else lost; those it holds when it crashes
// are lost: that is the under-admission, at most two batches per process
// and key.
package lease

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// Taker is the store side of leasing.
type Taker interface {
	// Take leases at least need and at most want units of key at now,
	// charging them in the store in one call, or none when fewer than
	// need are available. It returns the units granted and the key's
	// state after the call, as Ready reads it. A Taker may give back first
	// what back returns (see Return), or ignore it.
	Take(ctx context.Context, key string, now, want, need int64, back Return) (Grant, error)
	// Ready returns the earliest instant from now on at which a key in
	// state (as a Take returned it) could grant units, were nothing else
	// taken meanwhile.
	Ready(state, now, units int64) int64
}

// Grant is what a Take leased.
type Grant struct {
	Units   int64 // the units granted, 0 to need
	State   int64 // the key's state after the Take, for Ready
	Before  int64 // the state the Take granted from
	ResetAt int64 // the instant the key is back to full, as of the Take
}

// Return gives back the Units of a lease left unspent: if the key's state
// is still After, the one that lease left (no other writer since), a Take
// first sets it to what the lease would have left, taken at At on state
// Before, had it granted only Kept units. The exact inverse of the lease,
// for any algorithm; when the state moved on, the units are lost. The zero
// Return gives back nothing.
type Return struct {
	Units, Kept       int64
	After, Before, At int64
}

// Config configures a Leaser.
type Config struct {
	MaxBatch int64        // the largest batch a Take asks for (≥ 1)
	MaxAge   int64        // how long leased units stay spendable (ns)
	MaxKeys  int          // the pools kept before idle ones are dropped
	Timeout  int64        // bounds a caller's wait for a lease (ns), 0: none
	Limit    int          // the Limit of the Decisions
	Now      func() int64 // the clock of the background refills
}

// Leaser leases units of keys from a Taker and spends them locally, one
// pool per key. It is safe for concurrent use; the zero value is not
// usable: create it with New, and end it with Close.
type Leaser struct {
	t   Taker
	cfg Config

	pools  sync.Map // key -> *pool
	npools atomic.Int64

	bg     context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	takes  atomic.Int64
	closed atomic.Bool
}

// pool is what one process holds for one key.
type pool struct {
	cur, prev atomic.Pointer[batch]
	size      atomic.Int64 // next batch size
	state     atomic.Int64 // the key's state as of the last Take
	takenAt   atomic.Int64 // the instant of the last Take
	due1      atomic.Int64 // due(1) as of the last Take
	resetAt   atomic.Int64 // when the key is full, as of the last Take
	refilling atomic.Bool
	lock      chan struct{} // held (one value in it) by the refill running
}

// batch is a lease: units spendable until expires.
type batch struct {
	left    atomic.Int64
	expires int64
	units   int64 // granted
	at      int64 // the Take's instant
	before  int64 // the key's state before it
	after   int64 // and after it
}

// New returns a Leaser taking from t.
func New(t Taker, cfg Config) *Leaser {
	ctx, cancel := context.WithCancel(context.Background())
	cfg.MaxBatch = max(cfg.MaxBatch, 1)
	return &Leaser{t: t, cfg: cfg, bg: ctx, stop: cancel}
}

// Close ends the background refills, waiting for them.
func (l *Leaser) Close() {
	l.closed.Store(true)
	l.stop()
	l.wg.Wait()
}

// Wait waits for the background refills running (for tests: no call may
// start one meanwhile).
func (l *Leaser) Wait() { l.wg.Wait() }

// Takes returns how many Takes the Leaser has made.
func (l *Leaser) Takes() int64 { return l.takes.Load() }

func (l *Leaser) pool(key string, now int64) *pool {
	if p, ok := l.pools.Load(key); ok {
		return p.(*pool)
	}
	if l.npools.Load() >= int64(l.cfg.MaxKeys) {
		l.sweep(now)
	}
	p := &pool{lock: make(chan struct{}, 1)}
	p.size.Store(min(8, l.cfg.MaxBatch))
	if q, loaded := l.pools.LoadOrStore(key, p); loaded {
		return q.(*pool)
	}
	l.npools.Add(1)
	return p
}

// sweep drops the pools that hold no live unit.
func (l *Leaser) sweep(now int64) {
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

// spend takes n units from a live batch of p, the older first; fromCur
// reports that they came from the newer, so that the older is spent (a
// refill then drops no unit of it but fewer than a request).
func (p *pool) spend(now, n int64) (left int64, fromCur, ok bool) {
	for i, bp := range [2]*atomic.Pointer[batch]{&p.prev, &p.cur} {
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
				return v - n, i == 1, true
			}
		}
	}
	return 0, false, false
}

// Allow decides n units of key at now: from the key's pool when it holds
// them (no call to the store), denied locally while the key's state as of
// the last Take cannot grant them, else after a Take. Its errors are the
// Taker's, or wrap throttle.ErrUnavailable and ctx's error when ctx (or
// Config.Timeout) ends while it waits for another caller's Take.
func (l *Leaser) Allow(ctx context.Context, key string, n int, now int64) (throttle.Decision, error) {
	p := l.pool(key, now)
	if left, fromCur, ok := p.spend(now, int64(n)); ok {
		if fromCur && 2*left < p.size.Load() {
			l.refillAsync(key, p)
		}
		return l.allowed(p, now, left), nil
	}
	if d, denied := l.cachedDenial(p, now, n); denied {
		return d, nil
	}
	return l.await(ctx, key, p, n, now) // the pool ran dry while there is demand
}

// await decides n units of key once the refill of p in flight, if any,
// ended, leasing if they are still wanted (growing the batch: callers
// waited). The wait and the lease together end with ctx, and within
// Config.Timeout.
func (l *Leaser) await(ctx context.Context, key string, p *pool, n int, now int64) (throttle.Decision, error) {
	if l.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(l.cfg.Timeout))
		defer cancel()
	}
	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return throttle.Decision{}, fmt.Errorf("%w: waiting for a lease: %w", throttle.ErrUnavailable, ctx.Err())
	}
	defer func() { <-p.lock }()
	now = max(now, l.cfg.Now())                    // decided at the end of the wait
	if left, _, ok := p.spend(now, int64(n)); ok { // another caller refilled
		return l.allowed(p, now, left), nil
	}
	if d, denied := l.cachedDenial(p, now, n); denied { // and took what was there
		return d, nil
	}
	if s := p.size.Load(); s < l.cfg.MaxBatch {
		p.size.Store(min(2*s, l.cfg.MaxBatch))
	}
	granted, err := l.refill(ctx, key, p, now, int64(n))
	if err != nil {
		return throttle.Decision{}, err
	}
	if granted == 0 {
		d, _ := l.cachedDenial(p, now, n)
		return d, nil
	}
	left, _, _ := p.spend(now, int64(n))
	return l.allowed(p, now, left), nil
}

func (l *Leaser) allowed(p *pool, now, left int64) throttle.Decision {
	return throttle.Decision{
		Allowed:    true,
		Limit:      l.cfg.Limit,
		Remaining:  int(min(left, int64(l.cfg.Limit))),
		ResetAfter: time.Duration(max(p.resetAt.Load()-now, 0)),
	}
}

// cachedDenial denies n units locally until, as of the last Take, a
// Take for them is due.
func (l *Leaser) cachedDenial(p *pool, now int64, n int) (throttle.Decision, bool) {
	at := p.due1.Load() // the same instant, as availability only grows with time
	if n > 1 {
		at = l.due(p, now, int64(n))
	}
	if now >= at {
		return throttle.Decision{}, false
	}
	return throttle.Decision{
		Limit:      l.cfg.Limit,
		RetryAfter: time.Duration(at - now),
		ResetAfter: time.Duration(max(p.resetAt.Load()-now, 0)),
	}, true
}

// due is the instant from which a Take for n units of p's key is worth a
// call to the store, as of the last Take: when the key can grant half a
// batch, or an eighth of MaxAge after it could first grant n. Over the
// limit a Take then brings half a batch or what accrued in MaxAge/8
// rather than one unit, and while callers are denied the store holds at
// most what accrues in MaxAge/8 beyond n.
func (l *Leaser) due(p *pool, now, n int64) int64 {
	state := p.state.Load()
	half := l.t.Ready(state, now, max(n, (p.size.Load()+1)/2))
	return min(half, l.t.Ready(state, p.takenAt.Load(), n)+l.cfg.MaxAge/8)
}

// refill leases a batch of p.size units (at least need) of key and
// installs it. It returns how many units were granted.
func (l *Leaser) refill(ctx context.Context, key string, p *pool, now, need int64) (int64, error) {
	want := max(p.size.Load(), need)
	if c := p.cur.Load(); c != nil && c.expires <= now && c.left.Load() > 0 {
		p.size.Store(max(p.size.Load()/2, 1)) // units expired unspent: lease less
	}
	l.takes.Add(1)
	g, err := l.t.Take(ctx, key, now, want, need, p.giveBack(now))
	if err != nil {
		return 0, err
	}
	p.state.Store(g.State)
	p.takenAt.Store(now)
	p.due1.Store(l.due(p, now, 1))
	p.resetAt.Store(g.ResetAt)
	if g.Units == 0 {
		return 0, nil
	}
	nb := &batch{expires: now + l.cfg.MaxAge, units: g.Units, at: now, before: g.Before, after: g.State}
	nb.left.Store(g.Units)
	p.prev.Store(p.cur.Swap(nb))
	return g.Units, nil
}

// giveBack takes the unspent units of p's last lease out of its pool
// once they expired at now, to be given back to the store by the next
// Take (a process that stalled longer than MaxAge loses none of them
// while no other process wrote the key). Called holding p.lock.
func (p *pool) giveBack(now int64) Return {
	b := p.cur.Load()
	if b == nil || now < b.expires || b.after != p.state.Load() {
		return Return{}
	}
	left := b.left.Swap(0) // a spend that read an earlier now finds none
	if left == 0 {
		return Return{}
	}
	return Return{Units: left, Kept: b.units - left, After: b.after, Before: b.before, At: b.at}
}

// refillAsync refills p in the background unless a refill is running.
func (l *Leaser) refillAsync(key string, p *pool) {
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
		select {
		case p.lock <- struct{}{}:
		case <-l.bg.Done():
			return
		}
		defer func() { <-p.lock }()
		now := l.cfg.Now()
		if now < p.due1.Load() {
			return // too little available: a later spend asks again
		}
		_, _ = l.refill(l.bg, key, p, now, 1) // the Taker bounds its call
	}()
}
