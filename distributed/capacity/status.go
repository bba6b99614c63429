package capacity

import (
	"slices"
)

// Status is a snapshot of a server.
type Status struct {
	Leadership Leadership
	Resources  []ResourceStatus // sorted by id
}

// ResourceStatus describes one resource of a server.
type ResourceStatus struct {
	ID        string
	Template  string // id of the matching template
	Capacity  float64
	Algorithm Algorithm
	Learning  bool    // still learning what clients hold
	Clients   int     // clients with an unexpired lease or demand
	Wants     float64 // sum of the clients' wants
	// Held is what the clients may hold: their unexpired leases, a
	// lowered lease at its old size until confirmed, what earlier
	// incarnations of a client hold, and what clients report holding
	// beyond their leases (ResourceRequest.Has). It can exceed Capacity
	// while those come down, and while the server learns.
	Held float64
}

// Status returns a snapshot of the server's leadership and resources.
func (s *Server) Status() Status {
	s.mu.Lock()
	now := s.now.Now()
	s.drop(now)
	s.mu.Unlock()
	// Each resource is locked only while it is read: requests on the
	// others go on.
	s.mu.RLock()
	st := Status{Leadership: s.lead, Resources: make([]ResourceStatus, 0, len(s.resources))}
	for _, r := range s.resources {
		r.mu.Lock()
		r.expire(now)
		r.syncUpstream() // in a tree: the parent's current grant
		rs := ResourceStatus{
			ID: r.id, Template: r.tmpl.ID, Capacity: r.tmpl.Capacity, Algorithm: r.tmpl.Algorithm,
			Learning: now < s.since+int64(r.tmpl.LearningDuration), Clients: len(r.list),
		}
		for _, h := range r.list {
			rs.Wants += h.wants
			rs.Held += h.holds()
		}
		r.mu.Unlock()
		st.Resources = append(st.Resources, rs)
	}
	s.mu.RUnlock()
	slices.SortFunc(st.Resources, func(a, b ResourceStatus) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return st
}
