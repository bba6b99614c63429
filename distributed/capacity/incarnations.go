package capacity

// The order of a client's calls (Incarnation, Sequence): stale calls and restarts.

// applied records req as the newest call of its client applied on r,
// whose lease grant has just set. r.mu or s.mu is held.
func (r *resource) applied(req *Request) {
	if req.Sequence != 0 {
		h := r.holders[req.Client]
		h.inc, h.seq = req.Incarnation, req.Sequence
	}
}

// stale reports whether the server applied a call of req's client newer
// than req on one of req's resources (all but those refused in errs), and
// the newest incarnation of the client it applied. s.mu is held.
func (s *Server) stale(req *Request, errs []error, now int64) (int64, bool) {
	if req.Sequence == 0 {
		return 0, false
	}
	inc, stale := req.Incarnation, false
	for i, rr := range req.Resources {
		r := s.resources[rr.Resource]
		if r == nil || errs != nil && errs[i] != nil {
			continue
		}
		r.expire(now)
		if h := r.holders[req.Client]; h != nil && h.newer(req.Incarnation, req.Sequence) {
			inc, stale = max(inc, h.inc), true
		}
	}
	return inc, stale
}

// newer reports whether h's lease was last changed by a call newer than
// (or the same as) the call inc, seq.
func (h *holder) newer(inc int64, seq uint64) bool {
	return h.seq != 0 && (h.inc > inc || h.inc == inc && h.seq >= seq)
}

// restarted reports whether the call inc, seq comes from a newer
// incarnation of h's client than the last call applied to h.
func (h *holder) restarted(inc int64, seq uint64) bool {
	return seq != 0 && h.seq != 0 && inc > h.inc
}

// retire moves h's lease to what earlier incarnations of its client may
// still hold, for a call of a new incarnation: the client restarted, and
// its previous life may have handed the lease on (a server in a tree
// passes it to its own clients, which keep using it). That lease counts
// on top of the new life's until it expires, and nothing the new life
// reports confirms it lower.
func (r *resource) retire(h *holder) {
	c0 := h.counted()
	if h.heldF > 0 || h.prevF > 0 {
		h.old += max(h.held, h.prev)
		h.oldF += max(h.heldF, h.prevF)
		h.oldUntil = max(h.oldUntil, h.until, h.prevUntil)
		r.wakeAt(h.oldUntil)
	}
	h.held, h.heldF, h.prev, h.prevF, h.prevUntil = 0, 0, 0, 0, 0
	r.held = r.held - c0 + h.counted()
}

// dropOld stops counting what earlier incarnations of h's client held.
func (r *resource) dropOld(h *holder) {
	c0 := h.counted()
	h.old, h.oldF, h.oldUntil = 0, 0, 0
	r.held = r.held - c0 + h.counted()
}
