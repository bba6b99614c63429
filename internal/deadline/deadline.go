// Package deadline gives calls to a store a per-call deadline without a
// timer per call, and the monotonic clock the breakers read.
package deadline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Shared gives each call a context that ends after the per-call
// timeout without arming a timer per call: context.WithTimeout costs a
// timer and a channel per decision, about a tenth of the client's CPU per
// round trip. Calls whose deadlines fall in the same tick (timeout/8)
// share one channel, closed by one timer at the end of the tick. The
// socket deadline (ctx.Deadline, which go-redis applies to reads and
// writes) is exact; Done, which go-redis waits on only for a pool slot or
// a retry back-off, fires at most one tick late.
//
// It serves only parents that can never be cancelled (Done() == nil, as
// context.Background); others get context.WithTimeout.
type Shared struct {
	timeout int64
	tick    int64
	mu      sync.Mutex
	cur     atomic.Pointer[tickEnd]
}

// tickEnd is a channel closed at end (on the monotonic clock of Mono).
type tickEnd struct {
	end int64
	ch  chan struct{}
}

// Init sets the per-call timeout; it must be called before With.
func (d *Shared) Init(timeout time.Duration) {
	d.timeout = int64(timeout)
	d.tick = max(d.timeout/8, int64(time.Millisecond))
}

// callCtx is the context of one call: parent's values, a deadline, and a
// shared Done channel.
type callCtx struct {
	context.Context
	deadline time.Time
	at       int64 // deadline on the clock of Mono
	done     <-chan struct{}
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *callCtx) Done() <-chan struct{}       { return c.done }

func (c *callCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
	}
	if Mono() >= c.at {
		return context.DeadlineExceeded
	}
	return nil
}

// With returns ctx bounded by the timeout, and its cancel function (nil
// when there is nothing to cancel).
func (d *Shared) With(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		return context.WithTimeout(ctx, time.Duration(d.timeout))
	}
	now := Mono()
	at := now + d.timeout
	t := d.cur.Load()
	if t == nil || t.end < at || t.end-d.tick > at {
		t = d.next(at)
	}
	return &callCtx{Context: ctx, deadline: time.Now().Add(time.Duration(d.timeout)), at: at, done: t.ch}, nil
}

// next installs the tick ending after at.
func (d *Shared) next(at int64) *tickEnd {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.cur.Load(); t != nil && t.end >= at && t.end-d.tick <= at {
		return t
	}
	r := at % d.tick
	if r < 0 {
		r += d.tick // floored: Mono may be negative (a testing/synctest bubble)
	}
	t := &tickEnd{end: at - r + d.tick, ch: make(chan struct{})}
	time.AfterFunc(time.Duration(t.end-Mono()), func() { close(t.ch) })
	d.cur.Store(t)
	return t
}

var epoch = time.Now()

// Mono reads the monotonic clock, in nanoseconds since the package was
// loaded: the instants of Deadlines, and of a Breaker whose owner has no
// clock of its own.
func Mono() int64 { return int64(time.Since(epoch)) }
