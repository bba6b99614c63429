package capacity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
)

// Bounds on requests, and defaults of the server's bounds.
const (
	// MaxIDLen is the longest client or resource id, in bytes.
	MaxIDLen = 256
	// MaxRequestResources is the most resources one request may carry.
	MaxRequestResources = 1000
	// DefaultMaxClients is the default bound on clients per resource.
	DefaultMaxClients = 100_000
	// DefaultMaxResources is the default bound on resources per server.
	DefaultMaxResources = 10_000
	// DefaultMaxLeases is the default bound on the client leases (a
	// client's lease or demand on a resource) a server holds in all: a
	// few hundred bytes each.
	DefaultMaxLeases = 200_000
	// DefaultMaxLeasesPerClient is the default bound on the resources
	// one client id holds leases on, as many as a Client can ask for.
	DefaultMaxLeasesPerClient = MaxRequestResources
	// DefaultJitter is the default spread of refresh intervals: ±10%.
	DefaultJitter = 0.1
	// maxWeightValue bounds ResourceRequest.Weight.
	maxWeightValue = maxWeight
)

// Request asks for capacity on any number of resources at once.
type Request struct {
	// Client identifies the client process: unique among all clients.
	Client string
	// Resources are the client's demands, at most one per resource.
	Resources []ResourceRequest
	// Incarnation and Sequence order a client's calls: Incarnation is
	// the client's start time (Unix nanoseconds), Sequence increases with
	// each call it sends. A server ignores a call older, in (Incarnation,
	// Sequence) order, than the newest it applied for the client on one
	// of the call's resources, answering Stale. Sequence 0 is never
	// refused (and orders nothing). A call of a newer incarnation than
	// the last one applied (the client restarted) makes the server count
	// the older one's lease, on top of the new one's, until it expires.
	Incarnation int64
	Sequence    uint64
}

// ResourceRequest is a client's demand on one resource.
type ResourceRequest struct {
	// Resource is the resource id.
	Resource string
	// Wants is the capacity the client would use: finite and >= 0.
	Wants float64
	// Has is the capacity of the client's unexpired lease when it sent
	// the request, 0 if none; for a gauge, the larger of that and the
	// units it holds. While learning a server confirms it, capped by what
	// is unclaimed; afterwards Has at most the last grant confirms that
	// grant. More than the new grant says that an answer never arrived or
	// that the client still uses more: the server counts it, up to what
	// it granted the client before (while learning, up to the capacity,
	// or with lease keys what the Token proves), until the client reports
	// less or the new lease expires.
	Has float64
	// Priority puts the client in a band; higher bands are served first.
	Priority int32
	// Weight is the client's weight in sharing: 0 means 1, otherwise in
	// (0, 2²⁰].
	Weight float64
	// Token is the Grant.Token of the lease reported in Has, nil if
	// none. A server with lease keys (WithLeaseKeys) credits Has, while
	// it learns, only up to what a valid token proves.
	Token []byte
}

// Response answers a Request.
type Response struct {
	// Redirect reports that this server is not the master: nothing was
	// granted, and the client should ask Master (when not empty).
	Redirect bool
	// Master is the address of the master, "" while unknown.
	Master string
	// Grants hold one lease per requested resource, in request order.
	Grants []Grant
	// Stale reports that the server had already applied a newer call of
	// this client (see Request.Sequence) and ignored this one: nothing
	// was granted and nothing changed. Incarnation is then the newest
	// incarnation of the client the server applied a call of.
	Stale       bool
	Incarnation int64
}

// Grant is a lease on the capacity of one resource.
type Grant struct {
	// Resource is the resource id.
	Resource string
	// Capacity is the granted capacity.
	Capacity float64
	// Lease is how long the grant is valid, counted from when the client
	// sent its request (on the client's own monotonic clock).
	Lease time.Duration
	// Refresh is when the client should ask again.
	Refresh time.Duration
	// SafeCapacity is what the client may use once the lease has expired
	// without a refresh (in Safe mode).
	SafeCapacity float64
	// Err, when not nil, reports that this resource was refused while
	// the others of the request were served: it wraps ErrResourceRefused
	// and throttle.ErrInvalid (a bad demand) or ErrExhausted (the
	// resource is at its bound of clients). Capacity and Lease are then 0.
	Err error
	// Token proves the grant to the server's replicas, nil without lease
	// keys: the client sends it back with Has (ResourceRequest.Token).
	Token []byte
}

// ReleaseRequest gives back a client's leases.
type ReleaseRequest struct {
	Client    string
	Resources []string
	// As in Request: a release older than the newest call the server
	// applied for the client on a resource leaves that resource be.
	Incarnation int64
	Sequence    uint64
}

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

// ServerOption configures a Server.
type ServerOption func(*serverSettings)

type serverSettings struct {
	clock        throttle.Clock
	maxClients   int
	maxResources int
	maxLeases    int
	perClient    int
	jitter       float64
	seed         uint64
	grace        time.Duration
	parent       *parentSettings
	keys         leaseKeys
}

// WithServerClock makes the server read time from c (for tests on virtual
// time). By default it reads the system's monotonic clock.
func WithServerClock(c throttle.Clock) ServerOption {
	return func(s *serverSettings) { s.clock = c }
}

// WithMaxClients bounds the clients per resource (default
// DefaultMaxClients); requests beyond fail with ErrExhausted.
func WithMaxClients(n int) ServerOption { return func(s *serverSettings) { s.maxClients = n } }

// WithMaxResources bounds the resources a server tracks (default
// DefaultMaxResources); requests beyond fail with ErrExhausted. A
// resource no client holds or wants any more is forgotten within
// DropInterval, and frees its place.
func WithMaxResources(n int) ServerOption { return func(s *serverSettings) { s.maxResources = n } }

// WithMaxLeases bounds the client leases (a client's lease or demand on
// one resource) the server holds in all, and those of one client id
// (defaults DefaultMaxLeases and DefaultMaxLeasesPerClient): a request
// that would need more fails with an error wrapping ErrExhausted, and
// nothing changes. The bound per client keeps one client id from taking
// the whole table; with unauthenticated clients, which can pick any id,
// only the total bounds memory. Leases free their place when they expire
// or are released.
func WithMaxLeases(total, perClient int) ServerOption {
	return func(s *serverSettings) { s.maxLeases, s.perClient = total, perClient }
}

// WithJitter spreads refresh intervals uniformly by ±f of their length
// (default DefaultJitter), so that clients do not refresh in lockstep.
func WithJitter(f float64) ServerOption { return func(s *serverSettings) { s.jitter = f } }

// WithDecreaseGrace is kept for compatibility and has no effect. A lease
// the server lowers counts at its old size until the client confirms the
// lower one (a refresh reporting Has at most the new capacity) or the old
// lease expires, however late or lost the answer is, so no grace period
// is needed; d must still be >= 0.
func WithDecreaseGrace(d time.Duration) ServerOption {
	return func(s *serverSettings) { s.grace = d }
}

// WithSeed seeds the jitter, for reproducible simulations.
func WithSeed(seed uint64) ServerOption { return func(s *serverSettings) { s.seed = seed } }

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

// leaseCount counts the holders of all of a server's resources. mu
// guards it when the server's lock is held only for reading.
type leaseCount struct {
	mu        sync.Mutex
	total     int
	perClient map[string]int
}

// reserve counts n new leases of client, or fails with an error wrapping
// ErrExhausted, counting nothing, when they would pass the bounds of set.
func (c *leaseCount) reserve(client string, n int, set *serverSettings) error {
	if n == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.total+n > set.maxLeases:
		return fmt.Errorf("%w: %d client leases in all", ErrExhausted, c.total)
	case c.perClient[client]+n > set.perClient:
		return fmt.Errorf("%w: client %q holds leases on %d resources", ErrExhausted, client, c.perClient[client])
	}
	c.total += n
	c.perClient[client] += n
	return nil
}

func (c *leaseCount) add(client string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += d
	if n := c.perClient[client] + d; n > 0 {
		c.perClient[client] = n
	} else {
		delete(c.perClient, client)
	}
}

type resource struct {
	mu      sync.Mutex // see Server.mu
	id      string
	tmpl    Template
	q       float64 // quantum of held capacity
	units   uint64  // capacity in quanta
	holders map[string]*holder
	list    []*holder
	held    uint64 // Σ holder.counted(), in quanta
	sumU    uint64 // Σ holder.u: while <= units, every share is its wants
	leases  *leaseCount
	idle    int64 // when drop found r without holders, 0 if it has some
	dirty   bool  // demands changed since the last division
	next    int64 // earliest expiry among holders
	demands []Demand
	shares  []float64
	up      *upstream  // the lease from the parent, in a server tree
	rng     *rand.Rand // jitter
	alloc   Allocator
}

type holder struct {
	client string
	idx    int
	wants  float64
	u      uint64 // wants as the division counts it, in quanta
	weight float64
	prio   int32
	held   uint64 // capacity of the unexpired lease, in quanta
	heldF  float64
	expiry int64 // lease expiry (also of the demand), server clock
	share  float64
	// The newest call of the client applied to this lease, in
	// (incarnation, sequence) order; seq 0 before any sequenced call.
	inc int64
	seq uint64
	// A lowered lease still counts at its old size, prev, until the
	// client confirms the lower one or the old lease expires at
	// prevUntil: until then the answer may be late or lost, and the
	// client keeps using the old lease.
	prev      uint64
	prevF     float64
	prevUntil int64
	// What earlier incarnations of the client may still hold (see
	// retire): counted on top of the current lease until oldUntil, and
	// never confirmed lower.
	old      uint64
	oldF     float64
	oldUntil int64
}

// counted is what the holder counts toward what is held, in quanta: the
// current incarnation's lease (or a lowered one's old size), and what
// earlier incarnations may still hold.
func (h *holder) counted() uint64 { return h.current() + h.old }

// current is what the current incarnation of h's client holds, in quanta.
func (h *holder) current() uint64 { return max(h.held, h.prev) }

// holds is what h's client may hold, in capacity: counted, exactly, and
// also at capacity 0, where there are no quanta.
func (h *holder) holds() float64 { return max(h.heldF, h.prevF) + h.oldF }

// NewServer returns a server of cfg. Errors wrap throttle.ErrInvalid.
func NewServer(cfg Config, opts ...ServerOption) (*Server, error) {
	c := cfg.WithDefaults()
	if err := c.check(); err != nil {
		return nil, err
	}
	set := serverSettings{maxClients: DefaultMaxClients, maxResources: DefaultMaxResources, maxLeases: DefaultMaxLeases,
		perClient: DefaultMaxLeasesPerClient, jitter: DefaultJitter, grace: time.Second}
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
	c := cfg.WithDefaults()
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

// setTemplate applies t, recounting what is held in the quanta of the new
// capacity (rounding up, so that held capacity is never undercounted).
func (r *resource) setTemplate(t Template) {
	r.tmpl = t
	q := quantum(t.Capacity)
	r.units = 0
	if q > 0 {
		r.units = uint64(math.Floor(t.Capacity / q))
	}
	r.q = q
	r.held = 0
	for _, h := range r.list {
		h.held, h.prev, h.old = r.count(h.heldF), r.count(h.prevF), r.count(h.oldF)
		r.held += h.counted()
	}
	r.sumU = 0
	for _, h := range r.list {
		h.u = r.quanta(h.wants)
		r.sumU += h.u
	}
	r.dirty = true
}

// count returns held capacity f in quanta, rounded up so that it is
// never undercounted; more than the whole capacity counts as just above
// it, so that sums cannot overflow.
func (r *resource) count(f float64) uint64 {
	if r.q == 0 {
		return 0
	}
	return uint64(min(math.Ceil(f/r.q), float64(r.units+1)))
}

// quanta returns wants as the division counts it: at most the capacity,
// in whole quanta.
func (r *resource) quanta(wants float64) uint64 {
	if r.q == 0 {
		return 0
	}
	return uint64(math.Floor(min(cleanWants(wants), r.tmpl.Capacity) / r.q))
}

// validate checks a request before anything is changed.
func validate(req *Request) error {
	switch {
	case req == nil:
		return invalidf("nil request")
	case req.Client == "" || len(req.Client) > MaxIDLen:
		return invalidf("client id must have 1 to %d bytes, got %d", MaxIDLen, len(req.Client))
	case len(req.Resources) == 0 || len(req.Resources) > MaxRequestResources:
		return invalidf("a request carries 1 to %d resources, got %d", MaxRequestResources, len(req.Resources))
	}
	return nil
}

// refusals checks each resource of req on its own: the error of each
// one refused (a bad demand, an id requested twice), nil if none is.
func refusals(req *Request) []error {
	var errs []error
	for i := range req.Resources {
		rr := &req.Resources[i]
		err := rr.check()
		for _, o := range req.Resources[:i] {
			if err == nil && o.Resource == rr.Resource {
				err = invalidf("resource %q requested twice", rr.Resource)
			}
		}
		errs = refuse(errs, len(req.Resources), i, err)
	}
	return errs
}

// refuse records err (if not nil) as the refusal of resource i of n.
func refuse(errs []error, n, i int, err error) []error {
	if err == nil {
		return errs
	}
	if errs == nil {
		errs = make([]error, n)
	}
	errs[i] = refused(err)
	return errs
}

// priorities returns the priority of each resource of req.
func (req *Request) priorities() []int32 {
	out := make([]int32, len(req.Resources))
	for i, rr := range req.Resources {
		out[i] = rr.Priority
	}
	return out
}

// check validates one resource's demand. Errors wrap throttle.ErrInvalid.
func (rr *ResourceRequest) check() error {
	switch {
	case rr.Resource == "" || len(rr.Resource) > MaxIDLen:
		return invalidf("resource id must have 1 to %d bytes, got %d", MaxIDLen, len(rr.Resource))
	case !(rr.Wants >= 0) || math.IsInf(rr.Wants, 0):
		return invalidf("resource %q: wants must be finite and >= 0, got %v", rr.Resource, rr.Wants)
	case !(rr.Has >= 0) || math.IsInf(rr.Has, 0):
		return invalidf("resource %q: has must be finite and >= 0, got %v", rr.Resource, rr.Has)
	case !(rr.Weight >= 0) || rr.Weight > maxWeightValue:
		return invalidf("resource %q: weight must be in [0, %d], got %v", rr.Resource, maxWeightValue, rr.Weight)
	}
	return nil
}

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
	resp := &Response{Master: s.lead.Master, Grants: make([]Grant, len(req.Resources))}
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
		return nil, fmt.Errorf("%w: a server in a tree asks its parent in at most %d priority bands", ErrExhausted, MaxParentBands)
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
	resp = &Response{Master: s.lead.Master, Grants: make([]Grant, len(req.Resources))}
	for i := range req.Resources {
		resp.Grants[i] = s.grant(rs[i], req, &req.Resources[i], now)
		rs[i].applied(req)
	}
	return resp, true, nil
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
	r.wakeAt(h.expiry)
	if t.Algorithm.shares() && rr.Has > h.heldF {
		r.claim(h, min(rr.Has, s.claimLimit(r, h, rr, before, now)))
	}
	return Grant{Resource: r.id, Capacity: g, Lease: lease, Refresh: max(refresh, time.Millisecond), SafeCapacity: t.SafeCapacity,
		Token: s.set.keys.sign(s.lead.Term, client, r.id, g, h.expiry)}
}

// holder returns client's holder of r, adding it if it has none (its
// lease is counted by reserve).
func (r *resource) holder(client string) *holder {
	h := r.holders[client]
	if h == nil {
		h = &holder{client: client, idx: len(r.list)}
		r.holders[client] = h
		r.list = append(r.list, h)
		r.dirty = true
	}
	return h
}

// setDemand records what h asks for in rr, and marks r for dividing
// again unless h's lease stays what it is.
func (r *resource) setDemand(h *holder, rr *ResourceRequest) {
	weight := rr.Weight
	if weight == 0 {
		weight = 1
	}
	if h.wants == rr.Wants && h.weight == weight && h.prio == rr.Priority {
		return
	}
	u := r.quanta(rr.Wants)
	still := h.weight == weight && h.prio == rr.Priority && r.stillCut(h, u)
	h.wants, h.weight, h.prio = rr.Wants, weight, rr.Priority
	r.sumU = r.sumU - h.u + u
	h.u = u
	if !still {
		r.dirty = true
	}
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

// setHeld records that h now holds u quanta (f in capacity). A lowered
// lease keeps counting at its old size until it expires (h.expiry, not yet
// moved on) or the client confirms the lower one. At capacity 0 there are
// no quanta to count in: the sizes in capacity (heldF, prevF) still say
// what h's client may hold, for a server in a tree to report to its
// parent, and count again once the capacity is back.
func (r *resource) setHeld(h *holder, u uint64, f float64) {
	c0 := h.counted()
	if u < h.held || r.q == 0 && f < h.heldF {
		if h.heldF > h.prevF {
			h.prev, h.prevF = h.held, h.heldF
		}
		h.prevUntil = max(h.prevUntil, h.expiry)
		r.wakeAt(h.prevUntil)
	}
	h.held, h.heldF = u, f
	r.held = r.held - c0 + h.counted()
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

// claim counts what h's client says it holds beyond its new lease, has:
// the answer that lowered its lease may not have arrived, and a gauge's
// units in flight outlive a lease. It counts as a lowered lease's old
// size until the client reports less or the new lease expires.
func (r *resource) claim(h *holder, has float64) {
	if has > h.prevF {
		c0 := h.counted()
		h.prev, h.prevF = r.count(has), has
		r.held = r.held - c0 + h.counted()
	}
	if h.prevF > 0 && h.prevUntil < h.expiry {
		h.prevUntil = h.expiry
		r.wakeAt(h.prevUntil)
	}
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
		h.oldUntil = max(h.oldUntil, h.expiry, h.prevUntil)
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

// dropPrev stops counting h's lowered lease at its old size.
func (r *resource) dropPrev(h *holder) {
	c0 := h.counted()
	h.prev, h.prevF, h.prevUntil = 0, 0, 0
	r.held = r.held - c0 + h.counted()
}

// wakeAt makes expire look at the holders again at t.
func (r *resource) wakeAt(t int64) {
	if r.next == 0 || t < r.next {
		r.next = t
	}
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
	r.alloc.AllocateInto(r.shares, r.tmpl.Algorithm, r.tmpl.Capacity, r.demands)
	for i, h := range r.list {
		h.share = r.shares[i]
	}
	r.dirty = false
}

// expire drops the clients whose lease has run out, and a lowered
// lease's old size once the old lease has (it may outlive a shorter
// grant).
func (r *resource) expire(now int64) {
	if r.next == 0 || now < r.next {
		return
	}
	r.next = 0
	for i := 0; i < len(r.list); {
		h := r.list[i]
		if h.expiry <= now && h.prevUntil <= now && h.oldUntil <= now {
			r.remove(h)
			continue
		}
		if h.prevUntil != 0 {
			if h.prevUntil <= now {
				r.dropPrev(h)
			} else {
				r.wakeAt(h.prevUntil)
			}
		}
		if h.oldUntil != 0 {
			if h.oldUntil <= now {
				r.dropOld(h)
			} else {
				r.wakeAt(h.oldUntil)
			}
		}
		if h.expiry > now {
			r.wakeAt(h.expiry)
		}
		i++
	}
}

func (r *resource) remove(h *holder) {
	r.held -= h.counted()
	r.sumU -= h.u
	last := r.list[len(r.list)-1]
	r.list[h.idx] = last
	last.idx = h.idx
	r.list[len(r.list)-1] = nil
	r.list = r.list[:len(r.list)-1]
	delete(r.holders, h.client)
	r.leases.add(h.client, -1)
	r.dirty = true
}

// DropInterval is how often a server looks for resources that no client
// holds or wants any more: it forgets a resource it finds so twice in a
// row, so that its state, and its place under the bound of resources
// (WithMaxResources), is freed one to two DropIntervals after its last
// lease expired or was released, while a client whose refresh arrives
// just after its lease expired finds the resource as it was.
const DropInterval = time.Second

// drop forgets the resources that no client holds or wants any more (all
// their leases have expired or were released), so that their ids, made
// up or not, do not fill the bound of resources. It looks at most once
// per DropInterval. s.mu is held.
func (s *Server) drop(now int64) {
	if now < s.sweepAt {
		return
	}
	s.sweepAt = now + int64(DropInterval)
	for id, r := range s.resources {
		n := len(r.list)
		r.expire(now)
		switch {
		case len(r.list) > 0:
			r.idle = 0
			if len(r.list) < n {
				s.reportUpstream(r) // clients left: a server in a tree wants less
			}
			continue
		case r.idle == 0:
			r.idle = now
			continue
		}
		delete(s.resources, id)
		if r.up != nil {
			s.closeUpstream(r)
		}
	}
}

// Release gives back the client's leases on the resources of req at
// once, so that others get them at their next refresh. A server that is
// not the master returns a redirect. Unknown resources are ignored.
// Errors wrap throttle.ErrInvalid.
func (s *Server) Release(_ context.Context, req *ReleaseRequest) (*Response, error) {
	switch {
	case req == nil:
		return nil, invalidf("nil request")
	case req.Client == "" || len(req.Client) > MaxIDLen:
		return nil, invalidf("client id must have 1 to %d bytes, got %d", MaxIDLen, len(req.Client))
	case len(req.Resources) > MaxRequestResources:
		return nil, invalidf("a request carries at most %d resources, got %d", MaxRequestResources, len(req.Resources))
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
	h.u, h.wants, h.expiry = 0, 0, 0
	r.dirty = true
	if req.Sequence != 0 {
		h.inc, h.seq = req.Incarnation, req.Sequence
	}
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
