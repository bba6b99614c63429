package storelimit

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
)

// Over a BatchStore, the swaps of a Limiter's decisions on different keys
// go to the store together when many are in flight: while batchSlots
// calls of the Limiter are at the store, the swaps that arrive wait, and
// when a call returns the swaps waiting go as one batch, led by the one
// with the latest deadline: one call to the store (one statement, one
// commit) for all of them. A swap that finds a slot free goes at once,
// alone, so a caller never waits for a batch while fewer than batchSlots
// calls are in flight. Each swap keeps its own compare-and-swap: one that
// fails returns the key's state, and its decision is made again on it, as
// without batches.

// batchSlots is how many calls of one Limiter may be at a BatchStore at
// once; swaps arriving while all are busy wait for the next batch.
// Measured on PostgreSQL with fsync on (docs/performance.md): up to 16
// statements in flight, each waiting for its commit, share their WAL
// flushes, and making callers wait for a batch there only adds a
// statement's latency (1 or 2 slots at 16 callers: 0.4–0.6× the
// decisions/s); beyond, batches spend less CPU per decision than more
// statements would.
const batchSlots = 16

// maxBatch bounds the swaps of one batch; the others wait for the next.
const maxBatch = 128

// batcher gathers the swaps of one Limiter into batches. It is ready
// once slots and ops.New are set; it is safe for concurrent use. A swap
// that finds a slot free takes it with a compare-and-swap, without a
// lock; only waiting swaps take mu.
type batcher struct {
	slots   int64        // batchSlots, but in tests
	busy    atomic.Int64 // calls at the store, at most slots
	queued  atomic.Int64 // swaps waiting, in no batch yet (see release)
	mu      sync.Mutex   // guards waiting
	waiting []*swapOp    // for the next batch, in their order
	ops     sync.Pool    // of *swapOp, this Limiter's (see newRequest)
}

// swapOp is one swap waiting for, or taken into, a batch.
type swapOp struct {
	waiter
	sw    Swap
	h     uint64    // the hash of sw.Key
	batch []*swapOp // the batch it leads
	swaps []Swap    // the batch's swaps, as sent
}

func newSwapOp() any { return &swapOp{waiter: waiter{done: make(chan struct{}, 1)}} }

// acquire takes a free slot, if there is one.
func (b *batcher) acquire() bool {
	for {
		n := b.busy.Load()
		if n >= b.slots {
			return false
		}
		if b.busy.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// swap runs sw, whose key hashes to h, on bs: at once if a slot is free,
// else in the next batch. It returns sw with its outcome; an Err of ctx's
// when ctx ended while it waited (its swap may still be made).
func (b *batcher) swap(ctx context.Context, bs BatchStore, h uint64, sw Swap) Swap {
	if b.acquire() {
		return b.alone(ctx, bs, sw)
	}
	op := b.ops.Get().(*swapOp)
	op.sw, op.h = sw, h
	op.deadline, _ = ctx.Deadline()
	op.state.Store(waiting)
	b.mu.Lock()
	b.queued.Add(1) // before the last look for a slot: see release
	if b.acquire() {
		b.queued.Add(-1)
		b.mu.Unlock()
		b.ops.Put(op)
		return b.alone(ctx, bs, sw)
	}
	b.waiting = append(b.waiting, op)
	b.mu.Unlock()
	if op.wait(ctx) {
		if op.state.Load() == gone {
			b.queued.Add(-1)
		}
		sw.Err = ctx.Err() // op may still be written by its batch: not reused
		return sw
	}
	if op.state.Load() == leading {
		b.run(ctx, bs, op)
	}
	sw = op.sw
	op.sw = Swap{}
	b.ops.Put(op)
	return sw
}

// alone runs sw by itself in the slot it holds.
func (b *batcher) alone(ctx context.Context, bs BatchStore, sw Swap) Swap {
	sw.State, sw.Swapped, sw.Err = bs.CompareAndSwapLoad(ctx, sw.Key, sw.Old, sw.Next, sw.Now, sw.Expires)
	b.release()
	return sw
}

// release ends a call at the store: its slot goes to the waiting swap
// with the latest deadline, which leads the next batch, or is freed. A
// swap counts itself queued before its last look for a free slot, and
// release looks at the count after freeing one, so a swap is never left
// waiting with a slot free: either it sees the slot, or release sees it
// and takes the slot back for it.
func (b *batcher) release() {
	for {
		if b.queued.Load() > 0 {
			b.mu.Lock()
			lead, ok := pickLeader(b.waiting)
			if !ok { // those counted have left or lead already
				clear(b.waiting)
				b.waiting = b.waiting[:0]
			}
			b.mu.Unlock()
			if ok {
				lead.done <- struct{}{}
				return
			}
			runtime.Gosched()
		}
		b.busy.Add(-1)
		if b.queued.Load() == 0 || !b.acquire() {
			return
		}
	}
}

// take returns the batch lead leads: lead, then the swaps waiting in
// their order, at most maxBatch, one per key (a second swap of a key,
// from a leasing refill, waits for the next batch).
func (b *batcher) take(lead *swapOp) []*swapOp {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := append(lead.batch[:0], lead)
	rest := b.waiting[:0]
	for _, o := range b.waiting {
		switch {
		case o == lead:
		case len(batch) < maxBatch && !hasKey(batch, o) && o.state.CompareAndSwap(waiting, member):
			batch = append(batch, o)
		case o.state.Load() == waiting:
			rest = append(rest, o)
		}
	}
	clear(b.waiting[len(rest):])
	b.waiting = rest
	b.queued.Add(-int64(len(batch)))
	lead.batch = batch
	return batch
}

// hasKey reports whether batch holds a swap of o's key.
func hasKey(batch []*swapOp, o *swapOp) bool {
	for _, p := range batch {
		if p.h == o.h && p.sw.Key == o.sw.Key {
			return true
		}
	}
	return false
}

// run sends the batch lead leads to bs in one call, bounded by lead's
// deadline (the latest of the swaps waiting when it was picked) whether
// or not lead's caller cancels, hands each swap its outcome, and releases
// the slot.
func (b *batcher) run(ctx context.Context, bs BatchStore, lead *swapOp) {
	// The swaps whose batch just returned ask again at once: give them a
	// moment to join this one rather than the next.
	runtime.Gosched()
	batch := b.take(lead)
	ctx = context.WithoutCancel(ctx)
	cancel := context.CancelFunc(func() {})
	if !lead.deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, lead.deadline)
	}
	swaps := lead.swaps[:0]
	for _, o := range batch {
		swaps = append(swaps, o.sw)
	}
	var err error
	if len(swaps) == 1 {
		s := &swaps[0]
		s.State, s.Swapped, s.Err = bs.CompareAndSwapLoad(ctx, s.Key, s.Old, s.Next, s.Now, s.Expires)
	} else {
		err = bs.CompareAndSwapBatch(ctx, swaps)
	}
	cancel()
	for i, o := range batch {
		o.sw = swaps[i]
		if err != nil {
			o.sw.Err = err
		}
		if o != lead {
			o.done <- struct{}{}
		}
	}
	clear(swaps)
	lead.swaps = swaps[:0]
	clear(batch)
	b.release()
}
