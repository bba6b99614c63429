package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
)

// maxConcurrency bounds the limit of NewConcurrency: every held unit is a
// member of a Redis sorted set.
const maxConcurrency = 1 << 20

// maxUnitsPerCall bounds the units one Allow takes, and one script call of
// Release or Extend touches, so that no call holds Redis (single-threaded,
// shared by every limiter) for more than about a millisecond; Release and
// Extend split larger sets.
const maxUnitsPerCall = 1024

// Concurrency limits how many units are in flight at once per key across
// every process sharing Redis, as counting.Limiter does in one process.
// Each unit is held with a lease: units not released (a holder that
// crashed or lost its network) come back when their lease runs out, so a
// dead holder never keeps slots forever. A holder that keeps units longer
// than the lease calls Extend.
//
// The units a process took are remembered by that process, so Release
// gives back the units of the calling process only. Decisions never carry
// a RetryAfter: capacity comes back by release (or lease expiry).
//
// A Concurrency is safe for concurrent use. The zero value is not usable;
// call NewConcurrency.
type Concurrency struct {
	*core
	lease int64
	id    string
	seq   atomic.Int64

	later   sync.WaitGroup // the releaser goroutine, while it runs
	closing chan struct{}  // closed by Close: retry now, once

	relMu    sync.Mutex // guards the releaser's queue
	queue    []lateRelease
	releaser bool // the releaser goroutine runs

	mu   sync.Mutex
	held map[string]*holding
}

// holding is what this process holds for one key: members in Redis, and
// units admitted without Redis by the failure policy.
type holding struct {
	members  []string
	open     int // admitted by failsafe.Open
	fallback int // admitted by the fallback limiter
}

var _ throttle.Limiter = (*Concurrency)(nil)

// NewConcurrency returns a concurrency limiter of limit units per key,
// each unit leased for lease. Errors wrap throttle.ErrInvalid.
func NewConcurrency(client redis.UniversalClient, limit int, lease time.Duration, opts ...Option) (*Concurrency, error) {
	switch {
	case limit <= 0 || limit > maxConcurrency:
		return nil, fmt.Errorf("%w: limit %d out of range [1, %d]", throttle.ErrInvalid, limit, maxConcurrency)
	case lease < time.Millisecond || lease > maxWindow:
		return nil, fmt.Errorf("%w: lease %v out of range [1ms, %v]", throttle.ErrInvalid, lease, maxWindow)
	}
	c, _, err := newCore(client, "cc", strconv.Itoa(limit), limit, opts)
	if err != nil {
		return nil, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("redislimit: holder id: %w", err)
	}
	cc := &Concurrency{core: c, lease: int64(lease), id: hex.EncodeToString(id[:]), held: map[string]*holding{}, closing: make(chan struct{})}
	c.closers = append(c.closers, func() {
		close(cc.closing)
		cc.later.Wait()
	})
	return cc, nil
}

// Allow takes n units for key if they are free, in one round trip. Give
// them back with Release. n may not exceed 1024. A call that
// fails after it may have reached Redis (a timeout) gives back, in the
// background, whatever it may have taken.
func (c *Concurrency) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return c.allowWith(ctx, key, n, c.allow)
}

func (c *Concurrency) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if n > maxUnitsPerCall {
		return throttle.Decision{}, fmt.Errorf("%w: %d units in one call; take at most %d per call", throttle.ErrInvalid, n, maxUnitsPerCall)
	}
	seq := c.seq.Add(int64(n)) - int64(n)
	ref, mode := c.now()
	var buf [9]any
	args := append(c.common(buf[:0], ref, mode), c.limit, n, c.lease, c.id, seq)
	r, err := c.run(ctx, concurrencyScript, []string{c.prefix + key}, args)
	if err != nil {
		if errorsIsUnavailable(err) && !errors.Is(err, failsafe.ErrOpen) {
			// The script may still run (sent before the deadline): give
			// back what it may take, once it can no longer be on its way.
			members := make([]string, n)
			for i := range members {
				members[i] = c.member(seq + int64(i))
			}
			c.releaseLater(key, members)
		}
		d, err := c.fail(ctx, key, n, err)
		if err == nil && d.Allowed {
			c.mu.Lock()
			h := c.holding(key)
			if c.policy == failsafe.Open {
				h.open += n
			} else {
				h.fallback += n
			}
			c.mu.Unlock()
		}
		return d, err
	}
	cur := int(integer(r[1]))
	d := throttle.Decision{Allowed: integer(r[0]) == 1, Limit: c.limit, Remaining: max(c.limit-cur, 0)}
	if d.Allowed {
		c.mu.Lock()
		h := c.holding(key)
		for i := range int64(n) {
			h.members = append(h.members, c.member(seq+i))
		}
		c.mu.Unlock()
	}
	return d, nil
}

func (c *Concurrency) member(seq int64) string { return c.id + ":" + strconv.FormatInt(seq, 10) }

// lateRelease is a set of members of key to remove from Redis: units a
// failed call may have taken, or a failed Release could not give back.
type lateRelease struct {
	key     string
	members []string
	due     time.Time     // next try
	wait    time.Duration // back-off
	until   time.Time     // their lease is over by then: give up
}

// maxLateMembers bounds what the releaser holds; members beyond come back
// when their lease runs out.
const maxLateMembers = 1 << 16

// releaseLater removes members of key from Redis in the background. It
// first waits twice the call timeout (by then a call sent late has run or
// never will), then tries until it succeeds, backing off up to 5 s, or
// until the members' lease is over; Close makes it try at once, one last
// time, and waits for it. Removing members never added is harmless.
func (c *Concurrency) releaseLater(key string, members []string) {
	now := time.Now()
	c.relMu.Lock()
	defer c.relMu.Unlock()
	if n := len(c.queue); n > 0 && n*len(members) > maxLateMembers {
		return
	}
	c.queue = append(c.queue, lateRelease{key: key, members: members, due: now.Add(2 * c.timeout),
		wait: 2 * c.timeout, until: now.Add(time.Duration(c.lease))})
	if !c.releaser {
		c.releaser = true
		c.later.Add(1)
		go c.release()
	}
}

// release is the releaser goroutine: it works through the queue until it
// is empty, or Close.
func (c *Concurrency) release() {
	defer c.later.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		c.relMu.Lock()
		if len(c.queue) == 0 {
			c.releaser = false
			c.relMu.Unlock()
			return
		}
		next := c.queue[0].due
		for _, q := range c.queue {
			if q.due.Before(next) {
				next = q.due
			}
		}
		c.relMu.Unlock()
		closing := false
		t.Reset(time.Until(next))
		select {
		case <-t.C:
		case <-c.closing:
			closing = true
		}
		c.relMu.Lock()
		batch := c.queue
		c.queue = nil
		c.relMu.Unlock()
		now := time.Now()
		var keep []lateRelease
		for _, q := range batch {
			if !closing && now.Before(q.due) {
				keep = append(keep, q)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			_, err := c.extend(ctx, q.key, "-", q.members)
			cancel()
			if err != nil && !closing && now.Before(q.until) {
				q.wait = min(2*q.wait, 5*time.Second)
				q.due = now.Add(q.wait)
				keep = append(keep, q)
			}
		}
		c.relMu.Lock()
		c.queue = append(keep, c.queue...)
		if closing {
			c.queue = nil
		}
		c.relMu.Unlock()
	}
}

// holding returns the record of key, creating it. c.mu is held.
func (c *Concurrency) holding(key string) *holding {
	h := c.held[key]
	if h == nil {
		h = new(holding)
		c.held[key] = h
	}
	return h
}

// Release gives back n of the units this process holds for key, newest
// first. Releasing more than the process holds returns an error wrapping
// throttle.ErrInvalid and releases nothing. If Redis cannot be reached the
// error wraps throttle.ErrUnavailable, the units are forgotten locally,
// and giving them back is retried in the background, backing off, until
// their lease is over (and once more by Close); units still not given back
// come back when their leases run out. Release works after Close.
func (c *Concurrency) Release(ctx context.Context, key string, n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: release of %d units", throttle.ErrInvalid, n)
	}
	c.mu.Lock()
	h := c.held[key]
	if h == nil || len(h.members)+h.open+h.fallback < n {
		held := 0
		if h != nil {
			held = len(h.members) + h.open + h.fallback
		}
		c.mu.Unlock()
		return fmt.Errorf("%w: release of %d units, %d held", throttle.ErrInvalid, n, held)
	}
	k := min(n, h.open)
	h.open -= k
	n -= k
	fb := min(n, h.fallback)
	h.fallback -= fb
	n -= fb
	// A copy: once the lock is released, Allow appends over the tail.
	members := slices.Clone(h.members[len(h.members)-n:])
	h.members = h.members[:len(h.members)-n]
	if len(h.members) == 0 && h.open == 0 && h.fallback == 0 {
		delete(c.held, key)
	}
	c.mu.Unlock()
	var err error
	if fb > 0 {
		if r, ok := c.fallback.(interface{ Release(string, int) error }); ok {
			err = r.Release(key, fb)
		}
	}
	if len(members) > 0 {
		if _, e := c.extend(ctx, key, "-", members); e != nil {
			err = e
			c.releaseLater(key, members) // forgotten here, retried there
		}
	}
	return err
}

// Extend renews the leases of the units this process holds for key, to a
// full lease from now, and returns how many were still held in Redis
// (units whose lease had already run out are lost and forgotten).
func (c *Concurrency) Extend(ctx context.Context, key string) (int, error) {
	if c.closed.Load() {
		return 0, throttle.ErrClosed
	}
	c.mu.Lock()
	var members []string
	if h := c.held[key]; h != nil {
		members = append(members, h.members...)
	}
	c.mu.Unlock()
	if len(members) == 0 {
		return 0, nil
	}
	alive, err := c.extend(ctx, key, c.lease, members)
	if err != nil {
		return 0, err
	}
	if len(alive) < len(members) {
		c.forget(key, members, alive)
	}
	return len(alive), nil
}

// extend runs the extend script (lease "-" releases) on members and
// returns those still held.
func (c *Concurrency) extend(ctx context.Context, key string, lease any, members []string) ([]any, error) {
	var alive []any
	for len(members) > 0 { // at most maxUnitsPerCall members per script
		part := members[:min(len(members), maxUnitsPerCall)]
		members = members[len(part):]
		ref, mode := c.now()
		args := make([]any, 0, 5+len(part))
		args = append(c.common(args, ref, mode), lease)
		for _, m := range part {
			args = append(args, m)
		}
		r, err := c.run(ctx, extendScript, []string{c.prefix + key}, args)
		if err != nil {
			return nil, err
		}
		alive = append(alive, r[1:]...)
	}
	return alive, nil
}

// forget drops from the local record of key the members among checked
// that Redis no longer holds (their lease ran out).
func (c *Concurrency) forget(key string, checked []string, alive []any) {
	lost := make(map[string]bool, len(checked))
	for _, m := range checked {
		lost[m] = true
	}
	for _, m := range alive {
		if s, ok := m.(string); ok {
			delete(lost, s)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[key]
	if h == nil {
		return
	}
	kept := h.members[:0]
	for _, m := range h.members {
		if !lost[m] {
			kept = append(kept, m)
		}
	}
	h.members = kept
	if len(h.members) == 0 && h.open == 0 && h.fallback == 0 {
		delete(c.held, key)
	}
}

// heldUnits returns how many units this process holds for key, as far as it
// knows (leases may have run out since).
func (c *Concurrency) heldUnits(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.held[key]; h != nil {
		return len(h.members) + h.open + h.fallback
	}
	return 0
}
