package gossip

import (
	"runtime"
	"sync/atomic"
)

// dirty collects the entries of a limiter whose counters changed, so that
// a round looks at those and not at the whole table. A decision adds an
// entry the first time it changes it in a round (see entry.touch) without
// a lock: it reserves a slot of the current chunk with one atomic add and
// stores the entry there. Tick takes the whole collection at once
// (take). The zero value is not usable: call init.
type dirty struct {
	cur  atomic.Pointer[chunk]
	last int // entries the last take returned (take's)
}

// chunk is a run of slots that adders reserve in order. When it is full,
// an adder replaces it by one twice as large that links back to it; take
// seals it, so that later adders go to the chunk that replaced it.
type chunk struct {
	n    atomic.Int64 // slots reserved (more than len(s) once full), plus sealed once taken
	s    []atomic.Pointer[entry]
	prev *chunk // the full chunk this one replaced; set before it is published
}

// sealed marks a chunk taken: adders that reserve a slot in it go to the
// current chunk instead.
const sealed = 1 << 62

const minChunk = 64

func (d *dirty) init() { d.cur.Store(&chunk{s: make([]atomic.Pointer[entry], minChunk)}) }

// add records e. Safe for concurrent use with add and take.
func (d *dirty) add(e *entry) {
	for {
		c := d.cur.Load()
		i := c.n.Add(1) - 1
		if i < int64(len(c.s)) {
			c.s[i].Store(e)
			return
		}
		if i < sealed {
			// Full: replace it (the loser of a race tries again on the
			// winner's chunk).
			d.cur.CompareAndSwap(c, &chunk{s: make([]atomic.Pointer[entry], 2*len(c.s)), prev: c})
		}
		// Sealed: take has published a new chunk; go there.
	}
}

// take returns the entries added since the last take, appended to out
// (an entry added once per round it changed in, so possibly more than
// once if take was not called for a round), and starts a new collection.
// It waits for the adds that reserved a slot before it sealed the chunk
// to store their entry (a few instructions). Not safe for concurrent use
// with itself.
func (d *dirty) take(out []*entry) []*entry {
	// Room for as many as last time: a chunk sized for a burst of new
	// keys would be made again every round.
	fresh := &chunk{s: make([]atomic.Pointer[entry], max(minChunk, d.last))}
	c := d.cur.Swap(fresh)
	from := len(out)
	defer func() { d.last = len(out) - from }()
	n := c.n.Add(sealed) - sealed
	for ; c != nil; c, n = c.prev, -1 {
		if n < 0 || n > int64(len(c.s)) {
			n = int64(len(c.s)) // a full chunk: every slot was reserved
		}
		for i := range n {
			e := c.s[i].Load()
			for e == nil {
				runtime.Gosched() // reserved, not stored yet
				e = c.s[i].Load()
			}
			out = append(out, e)
		}
	}
	return out
}
