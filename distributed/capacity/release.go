package capacity

import (
	"context"
)

// Release gives back the client's leases on the resources of req at
// once, so that others get them at their next refresh. A server that is
// not the master returns a redirect. Unknown resources are ignored.
// Errors wrap throttle.ErrInvalid.
func (s *Server) Release(_ context.Context, req *ReleaseRequest) (*Response, error) {
	switch {
	case req == nil:
		return nil, invalidf("nil request")
	case req.Client == "" || len(req.Client) > maxIDLen:
		return nil, invalidf("client id must have 1 to %d bytes, got %d", maxIDLen, len(req.Client))
	case len(req.Resources) > maxRequestResources:
		return nil, invalidf("a request carries at most %d resources, got %d", maxRequestResources, len(req.Resources))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lead.IsMaster {
		return &Response{Redirect: true, Master: s.lead.Master}, nil
	}
	now := s.now.Now()
	for _, id := range req.Resources {
		if r := s.resources[id]; r != nil {
			r.expire(now)
			if h := r.holders[req.Client]; h != nil && (req.Sequence == 0 || !h.newer(req.Incarnation, req.Sequence)) {
				r.release(h, req)
			}
		}
	}
	return &Response{Master: s.lead.Master}, nil
}

// release gives back h's lease and demand for req. What earlier
// incarnations of the client may still hold keeps counting (and h with
// it, wanting nothing) until it expires.
func (r *resource) release(h *holder, req *ReleaseRequest) {
	if h.restarted(req.Incarnation, req.Sequence) {
		r.retire(h)
	}
	if h.old == 0 {
		r.remove(h)
		return
	}
	c0 := h.counted()
	h.held, h.heldF, h.prev, h.prevF, h.prevUntil = 0, 0, 0, 0, 0
	r.held = r.held - c0 + h.counted()
	r.sumU -= h.u
	h.u, h.wants, h.expiry, h.until = 0, 0, 0, 0
	r.dirty = true
	if req.Sequence != 0 {
		h.inc, h.seq = req.Incarnation, req.Sequence
	}
}
