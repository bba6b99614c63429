package capacity

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/throttlekit/throttle/internal/clock"
)

// The Server: its state, construction, mastership (Run) and configuration.

// Server apportions the capacity of resources among the clients that ask
// for it, handing out leases. It is transport independent: serve it over
// the network with a handler, or call it in process. All methods are safe
// for concurrent use.
//
// A new Server is the master (as with Solo) and starts learning: for
// each resource's LearningDuration (at least its MaxLeaseLength) it only
// confirms leases that clients say they hold, within capacity, and new
// clients get 0. Then it divides capacity with the resource's algorithm,
// recomputing the division when demands change. A grant is min(share,
// wants, capacity − what the other clients may still hold), where a
// lowered lease counts at its old size until the client confirms it or
// it expires, so the sum of unexpired leases never exceeds the capacity
// (see the package doc for the conditions), also while shares move or a
// configuration changes.
//
// Requests on resources the server has (refreshes and new clients, the
// common case) take the server's lock only for reading and then the lock
// of each of their resources, so that requests on different resources do
// not wait for each other; the rest (new resources, releases,
// configuration, leadership, a server in a tree) take the server's lock
// for writing. A resource's division is recomputed only when its demands
// changed and do not all fit in its capacity.
type Server struct {
	// mu guards the server's state. Holding it for writing gives access
	// to all of it; holding it for reading gives access to the fields
	// below and, with a resource's own lock (taken in order of id), to
	// that resource.
	mu        sync.RWMutex
	cfg       Config
	set       serverSettings
	now       clock.Source
	lead      Leadership
	stateTerm int64 // the term in which the state was built; 0 before Run
	since     int64 // when this server became master
	resources map[string]*resource
	parent    *treeLink // the parent level's replicas, in a server tree
	sweepAt   int64     // when drop next looks for resources nobody holds
	leases    *leaseCount
}

// NewServer returns a server of cfg. Errors wrap throttle.ErrInvalid.
func NewServer(cfg Config, opts ...ServerOption) (*Server, error) {
	c := cfg.withDefaults()
	if err := c.check(); err != nil {
		return nil, err
	}
	set := serverSettings{maxClients: DefaultMaxClients, maxResources: DefaultMaxResources, maxLeases: DefaultMaxLeases,
		perClient: DefaultMaxLeasesPerClient, jitter: defaultJitter, grace: time.Second}
	for _, o := range opts {
		o(&set)
	}
	switch {
	case set.maxClients <= 0 || set.maxClients > 1<<20 || set.maxResources <= 0:
		return nil, invalidf("max clients must be in [1, 2^20] and max resources > 0")
	case set.maxLeases <= 0 || set.perClient <= 0:
		return nil, invalidf("max leases and max leases per client must be > 0, got %d and %d", set.maxLeases, set.perClient)
	case set.grace < 0:
		return nil, invalidf("decrease grace must be >= 0, got %v", set.grace)
	case !(set.jitter >= 0 && set.jitter < 1):
		return nil, invalidf("jitter must be in [0, 1), got %v", set.jitter)
	}
	if err := set.keys.check(); err != nil {
		return nil, err
	}
	if set.seed == 0 {
		set.seed = rand.Uint64()
	}
	s := &Server{cfg: c, set: set, now: clock.New(set.clock), resources: map[string]*resource{}}
	s.leases = &leaseCount{perClient: map[string]int{}}
	s.lead = Leadership{IsMaster: true, Term: 1}
	s.since = s.now.Now()
	if p := set.parent; p != nil {
		t, err := newTreeLink(p)
		if err != nil {
			return nil, err
		}
		s.parent = t
		go s.sweep()
	}
	return s, nil
}

// Run takes part in election e under address until ctx is done, serving
// only while master: a server that is not answers every request with a
// redirect to the master. On becoming master in a new term it forgets all
// state and starts learning; regaining mastership in the term its state
// is from (no other master in between) it keeps the state and whatever is
// left of learning. When Run returns it is no longer the master. Call Run
// before serving requests: until then the server acts as master.
func (s *Server) Run(ctx context.Context, e Election, address string) error {
	s.mu.Lock()
	s.lead = Leadership{}
	s.mu.Unlock()
	err := e.Campaign(ctx, address, func(l Leadership) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if l.IsMaster && l.Term != s.stateTerm {
			s.resources = map[string]*resource{}
			s.leases = &leaseCount{perClient: map[string]int{}}
			s.since = s.now.Now()
			s.stateTerm = l.Term
		}
		s.lead = l
	})
	// Campaign gave mastership up before returning.
	s.mu.Lock()
	s.lead = Leadership{}
	s.mu.Unlock()
	return err
}

// SetConfig replaces the configuration. Each resource takes its new
// template at once; a client sees a lowered capacity at its next refresh,
// and no grant makes the leases held add up to more than the new
// capacity. Errors wrap throttle.ErrInvalid, and leave the old
// configuration in place.
func (s *Server) SetConfig(cfg Config) error {
	c := cfg.withDefaults()
	if err := c.check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = c
	for _, r := range s.resources {
		t, ok := c.match(r.id)
		if !ok { // unreachable: a catch-all is required
			continue
		}
		r.setTemplate(t)
		r.syncUpstream() // in a tree the capacity is the parent's grant
	}
	return nil
}
