package storelimit

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// The decisions of one process on one key are made in rounds: while one
// goroutine (the round's leader) decides on the key with the store, the
// requests for the same key that arrive queue up, and the next round
// decides all of them, in their order, on one state: one
// read-decide-swap for the round however many requests it holds. A hot
// key then costs the store a round trip per round, not per request, and
// the requests of one process never race each other's compare-and-swap.
// The decisions are the in-process limiter's on the same trace: the
// requests of a round are decided one after the other, at the latest
// instant any of them read.

// Request states.
const (
	waiting int32 = iota // queued for the next round
	member               // taken into a round
	leading              // taken into a round, which it runs
	gone                 // left before it was taken: never decided
)

// waiter is what a request of a round and a swap of a batch have in
// common: a call waiting for its result or its turn to lead.
type waiter struct {
	deadline time.Time // zero: none
	state    atomic.Int32
	done     chan struct{} // its result, or its turn to lead: one send
}

func (w *waiter) wt() *waiter { return w }

// wait waits for w's result or its turn to lead. It reports whether w
// left first because ctx ended: if no round or batch had taken it yet,
// it is never decided; if one had, its result may still be written (so w
// is not reused) and its units may be charged (as when a store's reply is
// lost).
func (w *waiter) wait(ctx context.Context) (left bool) {
	select {
	case <-w.done:
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiting, gone) || w.state.Load() == member {
			return true
		}
		<-w.done // made the leader: the hand-over signals at once
	}
	return false
}

// request is one call of Allow on its way through a round.
type request struct {
	waiter
	n   int
	now int64
	d   throttle.Decision
	err error
	one [1]*request // the round of a request alone
}

// newRequest makes a request for a Limiter's pool. Each Limiter has its
// own pool: a request's channel belongs to the goroutines of the Limiter
// that made it (inside a testing/synctest bubble, to that bubble).
func newRequest() any { return &request{waiter: waiter{done: make(chan struct{}, 1)}} }

// queue is a key with a round in flight, and the requests for the next.
type queue struct{ next []*request }

// shardCount is how many locks divide the keys in flight.
const shardCount = 64

// shard holds the keys in flight of a share of the hashes.
type shard struct {
	mu sync.Mutex
	m  map[string]*queue
}

var queues = sync.Pool{New: func() any { return new(queue) }}

// join queues r for key: it reports whether a round is in flight (then r
// waits for its turn), or else starts one with r alone.
func (sh *shard) join(key string, r *request) (queued bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if q, ok := sh.m[key]; ok {
		q.next = append(q.next, r)
		return true
	}
	if sh.m == nil {
		sh.m = make(map[string]*queue)
	}
	sh.m[key] = queues.Get().(*queue)
	return false
}

// handOver ends a round on key: it makes the waiting request with the
// latest deadline the next round's leader, or, when none is waiting,
// marks the key idle.
func (sh *shard) handOver(key string) {
	sh.mu.Lock()
	q := sh.m[key]
	lead, ok := pickLeader(q.next)
	if !ok {
		clear(q.next)
		q.next = q.next[:0]
		delete(sh.m, key)
		queues.Put(q)
	}
	sh.mu.Unlock()
	if ok {
		lead.done <- struct{}{}
	}
}

// take returns the round lead leads on key: the requests waiting for it,
// in their order, lead among them.
func (sh *shard) take(key string, lead *request) []*request {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.m[key]
	round := make([]*request, 0, len(q.next))
	for _, r := range q.next {
		if r == lead || r.state.CompareAndSwap(waiting, member) {
			round = append(round, r)
		}
	}
	clear(q.next)
	q.next = q.next[:0]
	return round
}

// pickLeader marks as leading the waiting request (or swap) of rs with
// the latest deadline and returns it, or reports false when every one of
// rs has gone.
func pickLeader[T interface{ wt() *waiter }](rs []T) (T, bool) {
	for {
		c, found := -1, false
		for i, r := range rs {
			if w := r.wt(); w.state.Load() == waiting && (!found || later(w.deadline, rs[c].wt().deadline)) {
				c, found = i, true
			}
		}
		if !found {
			var none T
			return none, false
		}
		if rs[c].wt().state.CompareAndSwap(waiting, leading) {
			return rs[c], true
		}
	}
}

// later reports whether deadline a is after b, the zero time (none)
// being after every other.
func later(a, b time.Time) bool {
	return !b.IsZero() && (a.IsZero() || a.After(b))
}

// await waits for r's decision or its turn to lead a round. A request
// whose ctx ends first leaves (see waiter.wait).
func (l *Limiter) await(ctx context.Context, sh *shard, key string, h uint64, r *request) (d throttle.Decision, left bool, err error) {
	if r.wait(ctx) {
		return throttle.Decision{}, true, unavailable(ctx.Err())
	}
	if r.state.Load() == leading {
		// The requests of the round just decided ask again at once:
		// give them a moment to join this round rather than the next.
		runtime.Gosched()
		l.lead(ctx, sh, key, h, r, sh.take(key, r))
	}
	return r.d, false, r.err
}

// lead runs round, which r leads, and hands the key over to the requests
// queued meanwhile. A round of others runs until the leader's deadline,
// the latest of the round's, whether or not the leader's caller cancels.
func (l *Limiter) lead(ctx context.Context, sh *shard, key string, h uint64, r *request, round []*request) {
	if len(round) > 1 {
		var cancel context.CancelFunc = func() {}
		ctx = context.WithoutCancel(ctx)
		if !r.deadline.IsZero() {
			ctx, cancel = context.WithDeadline(ctx, r.deadline)
		}
		defer cancel()
	}
	now := round[0].now
	for _, o := range round[1:] {
		now = max(now, o.now)
	}
	l.decide(ctx, key, h, round, now)
	for _, o := range round {
		if o != r {
			o.done <- struct{}{}
		}
	}
	sh.handOver(key)
}
