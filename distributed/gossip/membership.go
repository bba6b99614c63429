package gossip

import (
	"maps"
	"slices"
	"sync"

	"github.com/throttlekit/throttle/internal/subscribers"
)

// Member is a node of the cluster as a Membership knows it.
type Member struct {
	// ID is the node's gossip address: peers send to it, and it names
	// the node in every datagram (Config.ID).
	ID string
	// Incarnation identifies one life of the node and grows from one
	// life to the next; 0 if the membership does not know it. A node
	// refuses datagrams of a peer's incarnation below the one its
	// membership reported.
	Incarnation uint64
}

// MemberEventKind says what happened to a member.
type MemberEventKind int

const (
	// MemberJoin: the member is alive (new, back from the dead, or in a
	// new incarnation). It enters the spend-cap shares.
	MemberJoin MemberEventKind = iota + 1
	// MemberDead: a failure detector declared the member dead. It leaves
	// the spend-cap shares at once, but stays a peer: its late reports
	// are still charged, and a MemberJoin brings it back.
	MemberDead
	// MemberLeave: the member left the cluster. It is no longer a peer;
	// the hits it reported stay charged.
	MemberLeave
)

// MemberEvent is one change of the membership.
type MemberEvent struct {
	Kind   MemberEventKind
	Member Member
}

// Membership tells a Node who its peers are and when they join, die or
// leave, and who the node itself is. It decides membership only: the
// counters travel over the node's Transport.
//
// A Node calls Subscribe once, then Members, so a member may arrive both
// ways (a node treats a repeated MemberJoin as one). Implementations must
// be safe for concurrent use.
type Membership interface {
	// Local returns this node as the cluster knows it. A zero ID leaves
	// the node's ID to Config.ID or the transport's address; a zero
	// Incarnation, to the node's start time.
	Local() Member
	// Members returns the current peers, without this node.
	Members() []Member
	// Subscribe calls f with every change after it returns, one call at
	// a time, until stop is called. f must not block for long.
	Subscribe(f func(MemberEvent)) (stop func())
}

// StaticMembership is a Membership whose members the program sets: the
// default of a Node (Config.Peers), or a static list reloaded with Set. It
// is safe for concurrent use; create it with NewStaticMembership.
type StaticMembership struct {
	local Member

	mu      sync.Mutex        // guards the fields below, and orders the events
	members map[string]Member // the peers...
	dead    map[string]bool   // ...and those of them declared dead
	subs    subscribers.List[MemberEvent]
}

// NewStaticMembership returns a membership of local and the peers with
// the given IDs.
func NewStaticMembership(local Member, peers ...string) *StaticMembership {
	s := &StaticMembership{local: local, members: map[string]Member{}, dead: map[string]bool{}}
	s.Set(peers...)
	return s
}

// Local returns the member given to NewStaticMembership.
func (s *StaticMembership) Local() Member { return s.local }

// Members returns the peers not declared dead, sorted by ID.
func (s *StaticMembership) Members() []Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ms []Member
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		if !s.dead[id] {
			ms = append(ms, s.members[id])
		}
	}
	return ms
}

// Subscribe implements Membership.
func (s *StaticMembership) Subscribe(f func(MemberEvent)) (stop func()) { return s.subs.Subscribe(f) }

// Set makes peers the members: those new join, those missing leave.
func (s *StaticMembership) Set(peers ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := map[string]bool{}
	for _, id := range peers {
		if id == "" || id == s.local.ID {
			continue
		}
		keep[id] = true
		if _, ok := s.members[id]; !ok {
			s.emit(MemberEvent{Kind: MemberJoin, Member: Member{ID: id}})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		if !keep[id] {
			s.emit(MemberEvent{Kind: MemberLeave, Member: s.members[id]})
		}
	}
}

// update applies one event, as a failure detector reports it, and passes
// it to the subscribers (tests replay a failure detector's events so).
func (s *StaticMembership) update(e MemberEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emit(e)
}

// emit records e and calls the subscribers. Called with s.mu held.
func (s *StaticMembership) emit(e MemberEvent) {
	id := e.Member.ID
	if e.Kind == MemberLeave {
		delete(s.members, id)
	} else {
		s.members[id] = e.Member
	}
	s.dead[id] = e.Kind == MemberDead
	if !s.dead[id] {
		delete(s.dead, id)
	}
	s.subs.Emit(e)
}
