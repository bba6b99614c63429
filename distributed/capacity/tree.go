package capacity

import (
	"math"
	"sync/atomic"
	"time"
)

// A server tree: a server with a parent (WithParent) holds no capacity of
// its own. For each resource it asks its parent for capacity as one client
// does, with its own clients' demand added up, and apportions what it is
// granted among them with the resource's algorithm:
//
//   - it reports what it holds: the larger of its lease and what its
//     clients hold, so that a parent that restarts learns it, and a
//     lowered lease keeps counting at the parent until the clients have
//     come down to it;
//   - its clients' leases never outlive the lease they were cut from, and
//     their refresh interval is at most half its own;
//   - once its lease has expired without a refresh (the parent is
//     unreachable), it hands out the resource's safe capacity, as the
//     parent granted it, rather than 0;
//   - for FairShare it reports the weight of its demand at its current
//     water level: the weights of its unsatisfied clients plus, for each
//     satisfied one, its wants over that level. A parent dividing by those
//     weights reaches, within a few refreshes, the division it would make
//     among all the clients of the tree.
//
// The leases of the whole tree stay within the root's capacity as long as
// each parent's WithDecreaseGrace is at least its children's lease length
// (a lowered lease counts at its old size until then). While a parent is
// unreachable the bound is the safe capacities its children hand out.

// WithParent makes the server a child in a server tree: the capacity of
// each resource is what it leases from the servers at addrs (the parent
// level's replicas) through t, as a client with opts (WithClientID names
// it to the parent). Close stops it and gives the leases back.
func WithParent(t Transport, addrs []string, opts ...ClientOption) ServerOption {
	return func(s *serverSettings) {
		s.parent = &parentSettings{t: t, addrs: append([]string(nil), addrs...), opts: opts}
	}
}

type parentSettings struct {
	t     Transport
	addrs []string
	opts  []ClientOption
}

// upstream is a resource's link to the parent.
type upstream struct {
	r    *Resource
	held atomic.Uint64 // float64 bits: what the server's clients hold
}

// openUpstream opens r on the parent, reporting what r's clients hold.
func (s *Server) openUpstream(r *resource) error {
	res, err := s.parent.Resource(r.id, 0)
	if err != nil {
		return err
	}
	u := &upstream{r: res}
	res.mu.Lock()
	res.has = func() float64 { return math.Float64frombits(u.held.Load()) }
	res.mu.Unlock()
	r.up = u
	return nil
}

// syncUpstream makes r's capacity the parent's current grant (or, after
// it expired, the safe capacity); s.mu is held.
func (r *resource) syncUpstream() {
	if r.up == nil {
		return
	}
	if c := r.up.r.Capacity(); c != r.tmpl.Capacity {
		t := r.tmpl
		t.Capacity = c
		r.setTemplate(t)
	}
}

// reportUpstream tells the parent r's demand and what r's clients hold;
// s.mu is held.
func (r *resource) reportUpstream() {
	if r.up == nil {
		return
	}
	r.up.held.Store(math.Float64bits(float64(r.held) * r.q))
	var wants, weight float64
	var prio int32
	for i, h := range r.list {
		if h.wants > 0 {
			wants += h.wants
			if i == 0 || h.prio > prio {
				prio = h.prio
			}
		}
		weight += h.weight
	}
	if r.tmpl.Algorithm == FairShare {
		weight = r.demandWeight()
	}
	r.up.r.setDemand(wants, min(max(weight, 1), maxWeightValue), prio)
}

// demandWeight is the weight of r's demand at its current FairShare water
// level L: the weights of the clients granted less than they want, plus
// wants/L for each of the others (which a parent's division at L then
// gives exactly their wants).
func (r *resource) demandWeight() float64 {
	level, unsat := 0.0, 0.0
	for _, h := range r.list {
		if h.wants > 0 && h.share < h.wants {
			level = max(level, h.share/h.weight)
			unsat += h.weight
		}
	}
	if unsat == 0 { // everyone satisfied: the level is the highest want
		for _, h := range r.list {
			level = max(level, h.wants/h.weight)
		}
	}
	w := unsat
	for _, h := range r.list {
		if h.wants > 0 && h.share >= h.wants && level > 0 {
			w += h.wants / level
		}
	}
	if w == 0 {
		for _, h := range r.list {
			w += h.weight
		}
	}
	return w
}

// capLease bounds a lease and refresh interval cut from r's capacity by
// the parent's lease, which they must not outlive; s.mu is held.
func (r *resource) capLease(lease, refresh time.Duration) (time.Duration, time.Duration) {
	if r.up == nil {
		return lease, refresh
	}
	if l, ok := r.up.r.Lease(); ok {
		if left := time.Until(l.Expiry); left > 0 {
			lease = min(lease, left)
		}
		refresh = min(refresh, l.Refresh/2)
	}
	return lease, min(refresh, lease)
}

// Close stops a server with a parent from asking it for capacity and gives
// its leases back; it returns an error wrapping throttle.ErrUnavailable
// when no parent took the release. For a server without a parent it does
// nothing. Idempotent.
func (s *Server) Close() error {
	if s.parent == nil {
		return nil
	}
	return s.parent.Close()
}

// parentLease returns the lease the server holds from its parent on
// resource id, and whether it holds one.
func (s *Server) parentLease(id string) (Lease, bool) {
	s.mu.Lock()
	r := s.resources[id]
	s.mu.Unlock()
	if r == nil || r.up == nil {
		return Lease{}, false
	}
	return r.up.r.Lease()
}
