package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// maxInFlight is how many batches a batcher keeps in flight at once. More
// than one lets a request find a free slot while a batch travels; more
// split the concurrent requests into smaller batches, each a script run
// of its own. In the Envoy benchmark (16 and 64 streams, load average
// 41 to 47), Redis reads per request were 0.06 to 0.19 with one, 0.09 to
// 0.32 with two, 0.15 to 0.48 with four, at the same server CPU per
// decision; one in flight had the worst p99 (381 ms on 100,000 keys at 64
// streams, against 95 and 115 ms).
const maxInFlight = 2

// batcher joins the fixed-window charges of concurrent requests into one
// script run, one round trip: a request finding fewer than maxInFlight
// batches in flight is sent at once; otherwise it joins the batch being
// formed, sent as soon as one in flight returns. A lone request is thus
// never delayed, and under load the round trips per request fall with
// the concurrency.
//
// A request sent at once is sent by its own goroutine when run honours
// its context's deadline (direct), without a hand-off to another
// goroutine (each costs a wake-up, long on a loaded machine); the
// batches formed meanwhile, and every batch when run does not honour
// deadlines, are sent by maxInFlight goroutines started with the first,
// which close stops (their stacks stay grown: a goroutine per batch spent
// a tenth of the server's CPU growing its stack). Make it with
// newBatcher; safe for concurrent use.
type batcher struct {
	run     func(ctx context.Context, keys []string, args []any) ([]int64, error)
	timeout time.Duration // bounds each batch's round trip
	direct  bool          // run returns by its context's deadline
	work    chan *batch   // to the senders
	start   sync.Once

	mu       sync.Mutex
	pending  *batch // being formed; nil when none
	inflight int
	closed   bool
}

func newBatcher(timeout time.Duration, direct bool, run func(ctx context.Context, keys []string, args []any) ([]int64, error)) *batcher {
	return &batcher{run: run, timeout: timeout, direct: direct, work: make(chan *batch, maxInFlight)}
}

// batch is the keys and arguments of the requests sent together, and
// their counts once sent (done is closed).
type batch struct {
	keys     []string
	args     []any
	deadline time.Time // of its first request
	counts   []int64
	err      error
	done     chan struct{} // nil for a batch its caller sends
}

// do charges keys (args holds hits and time-to-live in pairs) within
// ctx, in a batch with the requests of other goroutines, and returns
// their counts in order, within the batcher's timeout of the call (a
// batch's deadline is its first request's). A request whose ctx ends
// first returns its error, though its batch may still be charged.
func (b *batcher) do(ctx context.Context, keys []string, args []any) ([]int64, error) {
	b.start.Do(func() {
		for range maxInFlight {
			go b.send()
		}
	})
	deadline := time.Now().Add(b.timeout)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errClosed
	}
	if b.inflight < maxInFlight { // then none is pending: send at once
		b.inflight++
		p := &batch{keys: keys, args: args, deadline: deadline}
		if b.direct {
			b.mu.Unlock()
			b.send1(ctx, p)
			b.handOff()
			return p.counts, p.err
		}
		p.done = make(chan struct{})
		b.work <- p // never blocks: at most maxInFlight are queued or in flight
		b.mu.Unlock()
		return p.wait(ctx, 0, len(keys))
	}
	p := b.pending
	if p == nil {
		p = &batch{done: make(chan struct{}), deadline: deadline}
		b.pending = p
	}
	off := len(p.keys)
	p.keys = append(p.keys, keys...)
	p.args = append(p.args, args...)
	b.mu.Unlock()
	return p.wait(ctx, off, len(keys))
}

// wait returns the n counts of p from off once it is done, or ctx's
// error if it ends first.
func (p *batch) wait(ctx context.Context, off, n int) ([]int64, error) {
	select {
	case <-p.done:
		if p.err != nil {
			return nil, p.err
		}
		return p.counts[off : off+n], nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// handOff releases a slot of a batch sent by its caller, or hands it to
// a sender if a batch formed meanwhile.
func (b *batcher) handOff() {
	b.mu.Lock()
	defer b.mu.Unlock()
	next := b.pending
	b.pending = nil
	switch {
	case next == nil:
		b.inflight--
	case b.closed:
		b.inflight--
		next.err = errClosed
		close(next.done)
	default:
		b.work <- next
	}
}

// send flushes the batches it is given until close.
func (b *batcher) send() {
	for p := range b.work {
		b.flush(p)
	}
}

// close stops the senders once the batches in flight are done; later
// requests fail.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.work)
	}
}

// errClosed fails a request to a closed backend.
var errClosed = errors.New("backend closed")

// send1 runs p within ctx and p's deadline, and marks it done.
func (b *batcher) send1(ctx context.Context, p *batch) {
	ctx, cancel := context.WithDeadline(ctx, p.deadline)
	p.counts, p.err = b.run(ctx, p.keys, p.args)
	cancel()
	if p.err == nil && len(p.counts) != len(p.keys) {
		p.err = fmt.Errorf("script returned %d counts for %d keys", len(p.counts), len(p.keys))
	}
	if p.done != nil {
		close(p.done)
	}
}

// flush sends p, then the batches formed meanwhile, until none is
// pending.
func (b *batcher) flush(p *batch) {
	for p != nil {
		b.send1(context.Background(), p)
		b.mu.Lock()
		p, b.pending = b.pending, nil
		if p == nil {
			b.inflight--
		}
		b.mu.Unlock()
	}
}
