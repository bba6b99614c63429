package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/throttlekit/throttle"
)

// GetCapacity's request path: a refresh under the read lock, the rest under the write lock.

// GetCapacity grants leases on the resources of req. A server that is not
// the master returns a redirect and grants nothing; a call older than
// one it applied for the client is answered Stale and changes nothing.
// A resource with a bad demand, or at its bound of clients, gets a Grant
// whose Err wraps ErrResourceRefused, and the others are served. Errors
// wrap throttle.ErrInvalid (bad request: client id, number of
// resources), ErrExhausted (bounds of resources or leases reached) or
// throttle.ErrUnavailable (ctx was done before the request was applied:
// the caller gave up on it); then nothing is granted and no state changes.
func (s *Server) GetCapacity(ctx context.Context, req *Request) (*Response, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	errs := refusals(req)
	if errs == nil {
		if resp, ok, err := s.refresh(ctx, req); ok {
			return resp, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A caller that gave up may have sent a later request already: this
	// one must not undo it (its Has would confirm a lowered lease that
	// the caller never got).
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: capacity: the caller gave up: %w", throttle.ErrUnavailable, err)
	}
	if !s.lead.IsMaster {
		return &Response{Redirect: true, Master: s.lead.Master}, nil
	}
	now := s.now.Now()
	s.drop(now)
	if inc, ok := s.stale(req, errs, now); ok {
		return &Response{Master: s.lead.Master, Stale: true, Incarnation: inc}, nil
	}
	// Check bounds and templates first, so a refusal changes nothing.
	errs, err := s.reserve(req, errs, now)
	if err != nil {
		return nil, err
	}
	resp := newResponse(s.lead.Master, len(req.Resources))
	for i, rr := range req.Resources {
		if errs != nil && errs[i] != nil {
			resp.Grants[i] = Grant{Resource: rr.Resource, Err: errs[i]}
			continue
		}
		r := s.resources[rr.Resource]
		if r == nil {
			r = s.addResource(rr.Resource)
		}
		r.syncUpstream()
		resp.Grants[i] = s.grant(r, req, &rr, now)
		r.applied(req)
		s.reportUpstream(r)
	}
	return resp, nil
}

// reserve checks req's resources (all but those refused in errs) against
// the templates and the bounds of clients, resources, leases and parent
// bands, and reserves the client's new leases. A resource that cannot be
// served is refused in the errs returned; an error refuses the whole
// request, and then nothing changed but the expiry of leases. s.mu is
// held.
func (s *Server) reserve(req *Request, errs []error, now int64) ([]error, error) {
	newRes, newLeases := 0, 0
	for i, rr := range req.Resources {
		if errs != nil && errs[i] != nil {
			continue
		}
		r := s.resources[rr.Resource]
		if r == nil {
			if _, ok := s.cfg.match(rr.Resource); !ok {
				errs = refuse(errs, len(req.Resources), i, invalidf("unknown resource %q", rr.Resource))
				continue
			}
			newRes++
			newLeases++
			continue
		}
		r.expire(now)
		if r.holders[req.Client] == nil {
			if len(r.list) >= s.set.maxClients {
				errs = refuse(errs, len(req.Resources), i, fmt.Errorf("%w: resource %q has %d clients", ErrExhausted, rr.Resource, len(r.list)))
				continue
			}
			newLeases++
		}
	}
	switch {
	case newRes > 0 && len(s.resources)+newRes > s.set.maxResources:
		return nil, fmt.Errorf("%w: %d resources", ErrExhausted, len(s.resources))
	case s.parent != nil && !s.parent.fits(req.priorities()):
		return nil, fmt.Errorf("%w: a server in a tree asks its parent in at most %d priority bands", ErrExhausted, maxParentBands)
	}
	if err := s.leases.reserve(req.Client, newLeases, &s.set); err != nil {
		return nil, err
	}
	return errs, nil
}

// addResource creates resource id from the template it matches. s.mu is
// held.
func (s *Server) addResource(id string) *resource {
	t, _ := s.cfg.match(id)
	r := &resource{id: id, holders: map[string]*holder{}, leases: s.leases,
		rng: rand.New(rand.NewPCG(s.set.seed, uint64(len(s.resources))))}
	if s.parent != nil {
		r.up = &upstream{bands: map[int32]*upBand{}} // nothing leased yet
	}
	r.setTemplate(t)
	s.resources[id] = r
	return r
}

// refresh answers req holding the server's lock for reading and the
// locks of req's resources, when that is enough: the server is the master
// and not in a tree, no sweep for unheld resources is due, every resource
// exists and none is at its bound of clients. ok is false otherwise, and
// nothing changed but the expiry of leases. req has no refused resource.
func (s *Server) refresh(ctx context.Context, req *Request) (resp *Response, ok bool, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.parent != nil || !s.lead.IsMaster {
		return nil, false, nil
	}
	now := s.now.Now()
	if now >= s.sweepAt {
		return nil, false, nil
	}
	var one [1]*resource
	rs, ok := s.existing(req, one[:0])
	if !ok {
		return nil, false, nil
	}
	defer unlockAll(lockAll(rs))
	if err := ctx.Err(); err != nil {
		return nil, true, fmt.Errorf("%w: capacity: the caller gave up: %w", throttle.ErrUnavailable, err)
	}
	// Order and bounds first, so that a refusal changes nothing.
	newLeases, inc, stale := 0, req.Incarnation, false
	for _, r := range rs {
		r.expire(now)
		h := r.holders[req.Client]
		switch {
		case h == nil && len(r.list) >= s.set.maxClients:
			return nil, false, nil // refused on its own, by GetCapacity
		case h == nil:
			newLeases++
		case req.Sequence != 0 && h.newer(req.Incarnation, req.Sequence):
			inc, stale = max(inc, h.inc), true
		}
	}
	if stale {
		return &Response{Master: s.lead.Master, Stale: true, Incarnation: inc}, true, nil
	}
	if err := s.leases.reserve(req.Client, newLeases, &s.set); err != nil {
		return nil, true, err
	}
	resp = newResponse(s.lead.Master, len(req.Resources))
	for i := range req.Resources {
		resp.Grants[i] = s.grant(rs[i], req, &req.Resources[i], now)
		rs[i].applied(req)
	}
	return resp, true, nil
}

// newResponse returns a Response from master with n grants to fill. The
// common answer, one grant, takes one allocation instead of two.
func newResponse(master string, n int) *Response {
	if n != 1 {
		return &Response{Master: master, Grants: make([]Grant, n)}
	}
	b := new(struct {
		resp Response
		one  [1]Grant
	})
	b.resp = Response{Master: master, Grants: b.one[:]}
	return &b.resp
}

// existing appends req's resources to rs in req's order; ok is false if
// one does not exist. s.mu is held.
func (s *Server) existing(req *Request, rs []*resource) (_ []*resource, ok bool) {
	if len(req.Resources) > cap(rs) {
		rs = make([]*resource, 0, len(req.Resources))
	}
	for _, rr := range req.Resources {
		r := s.resources[rr.Resource]
		if r == nil {
			return nil, false
		}
		rs = append(rs, r)
	}
	return rs, true
}

// lockAll locks rs in order of id, so that requests sharing resources
// cannot deadlock, and returns them in that order for unlockAll.
func lockAll(rs []*resource) (locked []*resource) {
	locked = rs
	if len(rs) > 1 {
		locked = slices.Clone(rs)
		slices.SortFunc(locked, func(a, b *resource) int { return strings.Compare(a.id, b.id) })
	}
	for _, r := range locked {
		r.mu.Lock()
	}
	return locked
}

// unlockAll unlocks what lockAll locked.
func unlockAll(locked []*resource) {
	for _, r := range locked {
		r.mu.Unlock()
	}
}
