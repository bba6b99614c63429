package capacity

import (
	"math"
	"slices"
	"time"
)

// How a grant is sized: the share, what learning confirms, claims beyond the lease.

// grant updates the demand rr of req's client on r and returns its new
// lease.
func (s *Server) grant(r *resource, req *Request, rr *ResourceRequest, now int64) Grant {
	t := r.tmpl
	client := req.Client
	h := r.holder(client)
	if h.restarted(req.Incarnation, req.Sequence) {
		r.retire(h)
	}
	before := h.heldF // the lease the client may hold
	r.setDemand(h, rr)
	if h.prevF > 0 && rr.Has <= h.heldF {
		// The client holds the last grant or less. Has above it means
		// the last answer has not arrived, or (a gauge) that the client
		// still holds more units: the old lease still counts.
		r.dropPrev(h)
	}
	var g float64
	refresh := t.RefreshInterval
	if t.Algorithm.shares() {
		g, refresh = s.take(r, h, rr, now)
	} else {
		g = r.share(h)
		r.setHeld(h, 0, g)
	}
	if j := s.set.jitter; j > 0 {
		refresh = time.Duration(float64(refresh) * (1 + j*(2*r.rng.Float64()-1)))
	}
	lease, refresh := r.capLease(t.LeaseLength, refresh)
	h.expiry = now + int64(lease)
	h.until = h.expiry + skewGrace(lease)
	r.wakeAt(h.until)
	if t.Algorithm.shares() && rr.Has > h.heldF {
		r.claim(h, min(rr.Has, s.claimLimit(r, h, rr, before, now)))
	}
	return Grant{Resource: r.id, Capacity: g, Lease: lease, Refresh: max(refresh, time.Millisecond), SafeCapacity: t.SafeCapacity,
		Token: s.set.keys.sign(s.lead.Term, client, r.id, g, h.expiry)}
}

// take gives h, of a resource whose algorithm shares, the free quanta of
// what it may have: its share, or while the server learns, what it says
// it holds. It returns h's capacity and when to ask again: sooner when
// capacity is still to move to or from h.
func (s *Server) take(r *resource, h *holder, rr *ResourceRequest, now int64) (g float64, refresh time.Duration) {
	t := r.tmpl
	refresh = t.RefreshInterval
	learnEnd := s.since + int64(t.LearningDuration)
	learning := now < learnEnd
	othersHeld := r.held - h.current() // with what h's earlier lives hold
	free := uint64(0)
	if r.units > othersHeld {
		free = r.units - othersHeld
	}
	var want float64
	if learning {
		// Confirm at most what the client says it holds: the
		// previous master may have given it out. With lease keys,
		// at most what a valid token proves it was granted.
		has := rr.Has
		if s.set.keys != nil {
			has = min(has, s.set.keys.credit(rr.Token, h.client, r.id, now))
		}
		want = min(has, rr.Wants)
	} else {
		want = min(r.share(h), rr.Wants)
	}
	u := uint64(0)
	if r.q > 0 {
		u = min(uint64(math.Floor(want/r.q)), free)
	}
	switch {
	case u < h.held:
		// Lowered: the old lease counts until the client confirms
		// the lower one, so ask for that confirmation soon.
		refresh /= 4
	case learning && float64(u)*r.q < rr.Wants-r.q:
		// Ask again when learning ends.
		refresh = min(refresh, time.Duration(learnEnd-now)+refresh/8)
	case !learning && float64(u)*r.q < want-r.q:
		// Others still hold part of this client's share: ask again
		// soon, so capacity moves within about one refresh interval.
		refresh /= 4
	}
	r.setHeld(h, u, float64(u)*r.q)
	return h.heldF, refresh
}

// claimLimit bounds what h's client may be counted as holding beyond its
// lease: what the server granted it before (its lease before this grant,
// and the old size of a lease it lowered); while learning, what an earlier
// master may have granted: up to the capacity, or with lease keys what a
// valid token proves.
func (s *Server) claimLimit(r *resource, h *holder, rr *ResourceRequest, before float64, now int64) float64 {
	limit := max(h.prevF, before)
	switch {
	case now >= s.since+int64(r.tmpl.LearningDuration):
	case s.set.keys != nil:
		limit = max(limit, s.set.keys.credit(rr.Token, h.client, r.id, now))
	default:
		limit = max(limit, r.tmpl.Capacity)
	}
	return limit
}

// share returns h's share of r. Outside a tree (where the parent is told
// every client's share) only a sharing algorithm whose demands do not all
// fit divides r, and only when its demands changed: each grant of Static
// and None depends on its own wants alone, and demands that fit each get
// their wants in full, whatever the algorithm, priorities and weights.
func (r *resource) share(h *holder) float64 {
	if r.up == nil {
		switch {
		case r.tmpl.Algorithm == Static:
			return min(cleanWants(h.wants), max(r.tmpl.Capacity, 0))
		case r.tmpl.Algorithm == None:
			return cleanWants(h.wants)
		case r.sumU <= r.units:
			return float64(h.u) * r.q
		}
	}
	if r.dirty {
		r.divide()
	}
	return h.share
}

// stillCut reports whether wanting u quanta instead of h.u leaves every
// share of r as it is: under FairShare, for a client cut below its wants
// that still wants more than its share. Its band's water level λ is then
// the same (the client counts at w·λ < u either way), and so is every
// share. Its share g = ⌊w·λ⌋ < u was cut, and u >= g+1 > w·λ.
func (r *resource) stillCut(h *holder, u uint64) bool {
	if r.dirty || r.tmpl.Algorithm != FairShare || r.q == 0 {
		return false
	}
	g := uint64(h.share / r.q) // exact: shares are whole quanta
	return g < h.u && g < u
}

// divide recomputes the shares of r's clients.
func (r *resource) divide() {
	n := len(r.list)
	r.demands = slices.Grow(r.demands[:0], n)[:n]
	r.shares = slices.Grow(r.shares[:0], n)[:n]
	for i, h := range r.list {
		r.demands[i] = Demand{Wants: h.wants, Weight: h.weight, Priority: int(h.prio)}
	}
	r.alloc.allocateInto(r.shares, r.tmpl.Algorithm, r.tmpl.Capacity, r.demands)
	for i, h := range r.list {
		h.share = r.shares[i]
	}
	r.dirty = false
}
