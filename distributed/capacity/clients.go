package capacity

import (
	"slices"
	"strings"
	"time"
)

// ClientStatus describes one client's demand and lease on a resource.
type ClientStatus struct {
	Client   string
	Wants    float64
	Priority int32
	Weight   float64
	// Held is the capacity of the client's lease; a lease the server
	// lowered counts at its old size until the client confirms it.
	Held float64
	// Expires is how long the lease stays valid without a refresh:
	// negative once it has expired while the server still counts what
	// the client may hold (up to 5 % of the lease length past it).
	Expires time.Duration
}

// Clients returns the clients with an unexpired lease or demand on
// resource id, sorted by client id: at most limit of them when limit > 0,
// and how many there are in all. An unknown resource has none. It is
// safe to call concurrently with the other methods; it copies the
// resource's clients under the resource's lock and sorts them after
// releasing it.
func (s *Server) Clients(id string, limit int) ([]ClientStatus, int) {
	s.mu.RLock()
	r := s.resources[id]
	if r == nil {
		s.mu.RUnlock()
		return nil, 0
	}
	r.mu.Lock()
	now := s.now.Now()
	r.expire(now)
	out := make([]ClientStatus, 0, len(r.list))
	for _, h := range r.list {
		out = append(out, ClientStatus{
			Client: h.client, Wants: h.wants, Priority: h.prio, Weight: h.weight,
			Held: max(h.heldF, h.prevF), Expires: time.Duration(h.expiry - now),
		})
	}
	r.mu.Unlock()
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b ClientStatus) int { return strings.Compare(a.Client, b.Client) })
	n := len(out)
	if limit > 0 && n > limit {
		out = out[:limit]
	}
	return out, n
}
