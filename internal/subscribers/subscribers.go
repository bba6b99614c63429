// Package subscribers keeps the subscribers of an event source: the
// gossip Memberships (gossip.StaticMembership, gossipmember's) tell their
// nodes of members joining, dying and leaving through it.
package subscribers

import (
	"maps"
	"slices"
	"sync"
)

// List keeps the subscribers to events of type E. The zero value has
// none; it is safe for concurrent use.
type List[E any] struct {
	mu   sync.Mutex // guards the fields below, and serializes Emit
	subs map[int]func(E)
	next int
}

// Subscribe adds f, called by Emit until stop is called.
func (s *List[E]) Subscribe(f func(E)) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs == nil {
		s.subs = map[int]func(E){}
	}
	id := s.next
	s.next++
	s.subs[id] = f
	return func() {
		s.mu.Lock()
		delete(s.subs, id)
		s.mu.Unlock()
	}
}

// Emit calls every subscriber with e, in the order they subscribed, one
// Emit at a time.
func (s *List[E]) Emit(e E) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(s.subs)) {
		s.subs[id](e)
	}
}
