package rules

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
)

// carry is a window limit rebuilt on reload (raised past its counters'
// capacity, or given another window) that carries each key's usage over
// from the limiter it replaces: for the old window's span, a key's first
// decision asks the old limiter what the key used and charges that to the
// new one (up to its limit) before deciding. Then the old limiter is
// closed and carry only forwards. Two first decisions on one key racing
// may both be decided before the usage is charged. Safe for concurrent
// use; the zero value is not usable.
type carry struct {
	next  throttle.Limiter
	limit atomic.Int64 // next's limit per window
	prev  atomic.Pointer[prevWindow]
	clock clock.Source
}

// prevWindow is the limiter a carry replaces, until its window passed.
type prevWindow struct {
	l     throttle.Limiter
	until int64 // on carry's clock
	moved sync.Map
}

func newCarry(next, prev throttle.Limiter, old, lim Limit, c throttle.Clock) *carry {
	cr := &carry{next: next, clock: clock.New(c)}
	cr.limit.Store(int64(lim.Count))
	cr.prev.Store(&prevWindow{l: prev, until: cr.clock.Now() + int64(old.Window)})
	return cr
}

func (c *carry) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if p := c.prev.Load(); p != nil {
		c.move(ctx, p, key)
	}
	return c.next.Allow(ctx, key, n)
}

// move charges key's usage in p to next, once per key; past p's window
// it retires p instead.
func (c *carry) move(ctx context.Context, p *prevWindow, key string) {
	if c.clock.Now() >= p.until {
		if c.prev.CompareAndSwap(p, nil) {
			closeLimiter(p.l)
		}
		return
	}
	if _, done := p.moved.Load(key); done {
		return
	}
	if _, done := p.moved.LoadOrStore(key, struct{}{}); done {
		return
	}
	d, err := p.l.Allow(ctx, key, 1) // what is left, less the one unit asked
	used := d.Limit - d.Remaining - 1
	if !d.Allowed {
		used = d.Limit
	}
	if err == nil && used > 0 {
		_, _ = c.next.Allow(ctx, key, min(used, int(c.limit.Load())))
	}
}

// Quota, SetLimit and Capacity are next's, so that a later reload adjusts
// it in place.
func (c *carry) Quota() throttle.Quota {
	if q, ok := c.next.(throttle.QuotaReporter); ok {
		return q.Quota()
	}
	return throttle.Quota{Limit: int(c.limit.Load())}
}

func (c *carry) SetLimit(limit int) error {
	s, ok := c.next.(limitSetter)
	if !ok {
		return invalid("the limiter cannot change its limit")
	}
	if err := s.SetLimit(limit); err != nil {
		return err
	}
	c.limit.Store(int64(limit))
	return nil
}

func (c *carry) Capacity() int {
	if s, ok := c.next.(interface{ Capacity() int }); ok {
		return s.Capacity()
	}
	return int(c.limit.Load())
}

// Close closes next, and the old limiter if it is still kept.
func (c *carry) Close() error {
	if p := c.prev.Swap(nil); p != nil {
		closeLimiter(p.l)
	}
	closeLimiter(c.next)
	return nil
}

// unwrapped is l, or the limiter a carry forwards to.
func unwrapped(l throttle.Limiter) throttle.Limiter {
	if c, ok := l.(*carry); ok {
		return c.next
	}
	return l
}
