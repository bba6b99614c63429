package capacity

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// A resource's server-side state: its holders, what they hold in quanta, the lease count.

// leaseCount counts the holders of all of a server's resources. mu
// guards it when the server's lock is held only for reading.
type leaseCount struct {
	mu        sync.Mutex
	total     int
	perClient map[string]int
}

// reserve counts n new leases of client, or fails with an error wrapping
// ErrExhausted, counting nothing, when they would pass the bounds of set.
func (c *leaseCount) reserve(client string, n int, set *serverSettings) error {
	if n == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.total+n > set.maxLeases:
		return fmt.Errorf("%w: %d client leases in all", ErrExhausted, c.total)
	case c.perClient[client]+n > set.perClient:
		return fmt.Errorf("%w: client %q holds leases on %d resources", ErrExhausted, client, c.perClient[client])
	}
	c.total += n
	c.perClient[client] += n
	return nil
}

func (c *leaseCount) add(client string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += d
	if n := c.perClient[client] + d; n > 0 {
		c.perClient[client] = n
	} else {
		delete(c.perClient, client)
	}
}

type resource struct {
	mu      sync.Mutex // see Server.mu
	id      string
	tmpl    Template
	q       float64 // quantum of held capacity
	units   uint64  // capacity in quanta
	holders map[string]*holder
	list    []*holder
	held    uint64 // Σ holder.counted(), in quanta
	sumU    uint64 // Σ holder.u: while <= units, every share is its wants
	leases  *leaseCount
	idle    int64 // when drop found r without holders, 0 if it has some
	dirty   bool  // demands changed since the last division
	next    int64 // earliest expiry among holders
	demands []Demand
	shares  []float64
	up      *upstream  // the lease from the parent, in a server tree
	rng     *rand.Rand // jitter
	alloc   allocator
}

type holder struct {
	client string
	idx    int
	wants  float64
	u      uint64 // wants as the division counts it, in quanta
	weight float64
	prio   int32
	held   uint64 // capacity of the unexpired lease, in quanta
	heldF  float64
	expiry int64 // lease expiry (also of the demand), server clock
	until  int64 // the lease counts until then: expiry + its grace (skewGrace)
	share  float64
	// The newest call of the client applied to this lease, in
	// (incarnation, sequence) order; seq 0 before any sequenced call.
	inc int64
	seq uint64
	// A lowered lease still counts at its old size, prev, until the
	// client confirms the lower one or the old lease expires at
	// prevUntil: until then the answer may be late or lost, and the
	// client keeps using the old lease.
	prev      uint64
	prevF     float64
	prevUntil int64
	// What earlier incarnations of the client may still hold (see
	// retire): counted on top of the current lease until oldUntil, and
	// never confirmed lower.
	old      uint64
	oldF     float64
	oldUntil int64
}

// counted is what the holder counts toward what is held, in quanta: the
// current incarnation's lease (or a lowered one's old size), and what
// earlier incarnations may still hold.
func (h *holder) counted() uint64 { return h.current() + h.old }

// current is what the current incarnation of h's client holds, in quanta.
func (h *holder) current() uint64 { return max(h.held, h.prev) }

// holds is what h's client may hold, in capacity: counted, exactly, and
// also at capacity 0, where there are no quanta.
func (h *holder) holds() float64 { return max(h.heldF, h.prevF) + h.oldF }

// setTemplate applies t, recounting what is held in the quanta of the new
// capacity (rounding up, so that held capacity is never undercounted).
func (r *resource) setTemplate(t Template) {
	r.tmpl = t
	q := quantum(t.Capacity)
	r.units = 0
	if q > 0 {
		r.units = uint64(math.Floor(t.Capacity / q))
	}
	r.q = q
	r.held = 0
	for _, h := range r.list {
		h.held, h.prev, h.old = r.count(h.heldF), r.count(h.prevF), r.count(h.oldF)
		r.held += h.counted()
	}
	r.sumU = 0
	for _, h := range r.list {
		h.u = r.quanta(h.wants)
		r.sumU += h.u
	}
	r.dirty = true
}

// count returns held capacity f in quanta, rounded up so that it is
// never undercounted; more than the whole capacity counts as just above
// it, so that sums cannot overflow.
func (r *resource) count(f float64) uint64 {
	if r.q == 0 {
		return 0
	}
	return uint64(min(math.Ceil(f/r.q), float64(r.units+1)))
}

// quanta returns wants as the division counts it: at most the capacity,
// in whole quanta.
func (r *resource) quanta(wants float64) uint64 {
	if r.q == 0 {
		return 0
	}
	return uint64(math.Floor(min(cleanWants(wants), r.tmpl.Capacity) / r.q))
}

// holder returns client's holder of r, adding it if it has none (its
// lease is counted by reserve).
func (r *resource) holder(client string) *holder {
	h := r.holders[client]
	if h == nil {
		h = &holder{client: client, idx: len(r.list)}
		r.holders[client] = h
		r.list = append(r.list, h)
		r.dirty = true
	}
	return h
}

// setDemand records what h asks for in rr, and marks r for dividing
// again unless h's lease stays what it is.
func (r *resource) setDemand(h *holder, rr *ResourceRequest) {
	weight := rr.Weight
	if weight == 0 {
		weight = 1
	}
	if h.wants == rr.Wants && h.weight == weight && h.prio == rr.Priority {
		return
	}
	u := r.quanta(rr.Wants)
	still := h.weight == weight && h.prio == rr.Priority && r.stillCut(h, u)
	h.wants, h.weight, h.prio = rr.Wants, weight, rr.Priority
	r.sumU = r.sumU - h.u + u
	h.u = u
	if !still {
		r.dirty = true
	}
}

// setHeld records that h now holds u quanta (f in capacity). A lowered
// lease keeps counting at its old size until it stops counting (h.until,
// not yet moved on) or the client confirms the lower one. At capacity 0 there are
// no quanta to count in: the sizes in capacity (heldF, prevF) still say
// what h's client may hold, for a server in a tree to report to its
// parent, and count again once the capacity is back.
func (r *resource) setHeld(h *holder, u uint64, f float64) {
	c0 := h.counted()
	if u < h.held || r.q == 0 && f < h.heldF {
		if h.heldF > h.prevF {
			h.prev, h.prevF = h.held, h.heldF
		}
		h.prevUntil = max(h.prevUntil, h.until)
		r.wakeAt(h.prevUntil)
	}
	h.held, h.heldF = u, f
	r.held = r.held - c0 + h.counted()
}

// claim counts what h's client says it holds beyond its new lease, has:
// the answer that lowered its lease may not have arrived, and a gauge's
// units in flight outlive a lease. It counts as a lowered lease's old
// size until the client reports less or the new lease expires.
func (r *resource) claim(h *holder, has float64) {
	if has > h.prevF {
		c0 := h.counted()
		h.prev, h.prevF = r.count(has), has
		r.held = r.held - c0 + h.counted()
	}
	if h.prevF > 0 && h.prevUntil < h.until {
		h.prevUntil = h.until
		r.wakeAt(h.prevUntil)
	}
}

// dropPrev stops counting h's lowered lease at its old size.
func (r *resource) dropPrev(h *holder) {
	c0 := h.counted()
	h.prev, h.prevF, h.prevUntil = 0, 0, 0
	r.held = r.held - c0 + h.counted()
}

// wakeAt makes expire look at the holders again at t.
func (r *resource) wakeAt(t int64) {
	if r.next == 0 || t < r.next {
		r.next = t
	}
}
