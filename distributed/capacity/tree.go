package capacity

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// A server tree: a server with a parent (WithParent) holds no capacity of
// its own. For each resource it asks its parent for capacity as a client
// does — one client per priority band its clients are in, carrying their
// demand added up — and apportions what it is granted among them with the
// resource's algorithm:
//
//   - it reports what it holds: per band, the larger of its lease and what
//     its clients in the band hold, so that a parent that restarts learns
//     it, and a lowered lease keeps counting at the parent until the
//     clients have come down to it;
//   - its clients' leases never outlive the leases they were cut from,
//     and their refresh interval is at most half its own;
//   - once its leases have expired without a refresh (the parent is
//     unreachable), it grants 0 until the parent grants it a lease again:
//     the parent no longer counts what it would hand out (its clients
//     whose own leases expire use their mode's fallback, as any client);
//   - for FairShare it reports the weight of each band's demand at the
//     band's current water level: the weights of its unsatisfied clients
//     plus, for each satisfied one, its wants over that level. A parent
//     dividing by those weights reaches, within a few refreshes, the
//     division it would make among all the clients of the tree.
//
// The leases of the whole tree stay within the root's capacity: a parent
// counts a child's lowered lease at its old size until the child confirms
// the lower one (reporting that it and its clients hold no more) or the
// old lease expires. A child that restarts (a new Server under the same
// client id at its parent) knows only the clients that report to it while
// the others keep the leases its previous life cut for them: its parent
// sees a new incarnation of the client and counts the previous life's
// grant, on top of the new one's, until that grant expires, whatever the
// new life reports. A restarted server learns, as a new master does, so a
// restarted root is covered too. Gauge units a leaf's clients keep past
// the expiry of the leaf's lease at its parent come on top, as units a
// client keeps past its own lease's expiry do: no unit is taken back.

// WithParent makes the server a child in a server tree: the capacity of
// each resource is what it leases from the servers at addrs (the parent
// level's replicas) through t, as a client with opts (WithClientID names
// it to the parent; each priority band beyond the first is a client of its
// own, named after it). Close stops it and gives the leases back.
func WithParent(t Transport, addrs []string, opts ...ClientOption) ServerOption {
	return func(s *serverSettings) {
		s.parent = &parentSettings{t: t, addrs: append([]string(nil), addrs...), opts: opts}
	}
}

type parentSettings struct {
	t     Transport
	addrs []string
	opts  []ClientOption
}

// maxParentBands bounds the priority bands a server in a tree asks its
// parent in at once: a request in one more band fails with ErrExhausted.
// A band none of the server's clients is in any more is given up once
// its lease from the parent has run out or come down to 0.
const maxParentBands = 16

// treeLink is a server's link to its parent: per priority band, clients
// of at most maxRequestResources resources each. s.mu is held to use it,
// except for close and err.
type treeLink struct {
	set  *parentSettings
	base *Client // band 0's first, and the name of the others
	mu   sync.Mutex
	band map[int32][]*Client
	stop chan struct{} // closed by Close: ends sweep
	once sync.Once
	// done is set by close and abandon, under mu: no background release
	// starts after it. bg counts those in flight, which close waits for.
	done bool
	bg   sync.WaitGroup
}

func newTreeLink(p *parentSettings) (*treeLink, error) {
	c, err := NewClient(p.t, p.addrs, append([]ClientOption{WithMode(Safe)}, p.opts...)...)
	if err != nil {
		return nil, err
	}
	return &treeLink{set: p, base: c, band: map[int32][]*Client{0: {c}}, stop: make(chan struct{})}, nil
}

// fits reports whether requests in the bands of prios fit under
// maxParentBands.
func (l *treeLink) fits(prios []int32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.band)
	for i, p := range prios {
		if l.band[p] == nil && !slices.Contains(prios[:i], p) {
			n++
		}
	}
	return n <= maxParentBands
}

// open opens resource id in band b at the parent, on a client of the band
// with room, starting one if none has.
func (l *treeLink) open(id string, b int32) (*Resource, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs := l.band[b]
	var c *Client
	for _, x := range cs {
		if x.open() < maxRequestResources {
			c = x
			break
		}
	}
	if c == nil {
		if len(cs) == 0 && len(l.band) >= maxParentBands {
			return nil, fmt.Errorf("%w: %d priority bands at the parent", ErrExhausted, len(l.band))
		}
		name := l.base.ID() + "/band" + strconv.Itoa(int(b))
		if len(cs) > 0 {
			name += "/" + strconv.Itoa(len(cs))
		}
		opts := append([]ClientOption{WithMode(Safe)}, l.set.opts...)
		var err error
		if c, err = NewClient(l.set.t, l.set.addrs, append(opts, WithClientID(name))...); err != nil {
			return nil, err
		}
		l.band[b] = append(cs, c)
	}
	return c.Resource(id, 0, WithPriority(b))
}

// giveUp stops asking the parent for res and gives its lease back in the
// background; a client left without resources is closed (but for the
// base client).
func (l *treeLink) giveUp(res *Resource) {
	res.shut()
	c := res.c
	// Stamped now, sent in the background: a call that takes res.id
	// again is stamped later, so the parent never applies this release
	// after it (it would free the new lease).
	if req := c.detach(res); req != nil {
		l.background(func() { _ = c.sendRelease(req) }) // or the lease expires at the parent
	}
	if c == l.base || c.open() > 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for b, cs := range l.band {
		if i := slices.Index(cs, c); i >= 0 {
			if cs = slices.Delete(cs, i, i+1); len(cs) == 0 {
				delete(l.band, b)
			} else {
				l.band[b] = cs
			}
			// It has nothing to give back; Close waits for its loop.
			l.backgroundLocked(func() { _ = c.Close() })
			return
		}
	}
}

// background runs f on a goroutine of its own that close waits for,
// unless the link is closed or abandoned.
func (l *treeLink) background(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backgroundLocked(f)
}

// backgroundLocked is background with l.mu held.
func (l *treeLink) backgroundLocked(f func()) {
	if l.done {
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		f()
	}()
}

// close closes the link's clients, giving their leases back, and waits
// for the releases in flight in the background.
func (l *treeLink) close() error {
	l.finish()
	var err error
	for _, c := range l.clients() {
		if e := c.Close(); e != nil {
			err = e
		}
	}
	l.bg.Wait()
	return err
}

// abandon stops the link's clients without giving their leases back.
func (l *treeLink) abandon() {
	l.finish()
	for _, c := range l.clients() {
		c.abandon()
	}
}

// finish starts no more background work.
func (l *treeLink) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
}

// clients returns the link's clients, of all bands.
func (l *treeLink) clients() []*Client {
	l.mu.Lock()
	defer l.mu.Unlock()
	var cs []*Client
	for _, band := range l.band {
		cs = append(cs, band...)
	}
	return cs
}

// upstream is a resource's leases from the parent, one per band.
type upstream struct {
	bands map[int32]*upBand
}

type upBand struct {
	r    *Resource
	held atomic.Uint64 // float64 bits: what the server's clients in the band hold
}

// openBand opens r's lease of band b at the parent; s.mu is held.
func (s *Server) openBand(r *resource, b int32) (*upBand, error) {
	if r.up == nil {
		r.up = &upstream{bands: map[int32]*upBand{}}
	}
	if u := r.up.bands[b]; u != nil {
		return u, nil
	}
	res, err := s.parent.open(r.id, b)
	if err != nil {
		return nil, err
	}
	u := &upBand{r: res}
	res.mu.Lock()
	res.has = func() float64 { return math.Float64frombits(u.held.Load()) }
	res.mu.Unlock()
	r.up.bands[b] = u
	return u, nil
}

// closeUpstream stops asking the parent for r and gives r's leases back;
// s.mu is held.
func (s *Server) closeUpstream(r *resource) {
	for _, u := range r.up.bands {
		s.parent.giveUp(u.r)
	}
	r.up = nil
}

// syncUpstream makes r's capacity what the parent grants it now: the sum
// of its unexpired leases, 0 with none (a lease granted without one would
// outlive the parent's, and the parent no longer counts it); s.mu is held.
func (r *resource) syncUpstream() {
	if r.up == nil {
		return
	}
	c := 0.0
	for _, u := range r.up.bands {
		if l, ok := u.r.Lease(); ok {
			c += l.Capacity
		}
	}
	if c != r.tmpl.Capacity {
		t := r.tmpl
		t.Capacity = c
		r.setTemplate(t)
	}
}

// reportUpstream tells the parent, per band, r's demand and what r's
// clients hold, and gives up the bands r's clients have left once their
// lease is down to 0; s.mu is held. A band it cannot open (the server is
// closed, or at maxParentBands) stays without a lease, so that r has
// none of its capacity.
func (s *Server) reportUpstream(r *resource) {
	if s.parent == nil {
		return
	}
	type band struct{ wants, weight, held float64 }
	bands := map[int32]*band{}
	for _, h := range r.list {
		b := bands[h.prio]
		if b == nil {
			b = new(band)
			bands[h.prio] = b
		}
		// Saturated: two finite wants may add up to +Inf, which no
		// parent accepts.
		b.wants = addSat(b.wants, h.wants)
		b.weight = addSat(b.weight, h.weight)
		b.held += h.holds()
	}
	if r.up != nil {
		for p, u := range r.up.bands {
			if bands[p] != nil {
				continue
			}
			if l, ok := u.r.Lease(); !ok || l.Capacity == 0 {
				s.parent.giveUp(u.r) // no client left, no capacity held
				delete(r.up.bands, p)
				continue
			}
			bands[p] = new(band) // no client left in the band: want nothing
		}
	}
	for p, b := range bands {
		u, err := s.openBand(r, p)
		if err != nil {
			continue
		}
		weight := b.weight
		if r.tmpl.Algorithm == FairShare {
			weight = r.demandWeight(p)
		}
		u.held.Store(math.Float64bits(b.held))
		u.r.setDemand(b.wants, min(max(weight, 1), maxWeightValue), p)
	}
}

// addSat adds two finite values >= 0, saturating at math.MaxFloat64.
func addSat(a, b float64) float64 { return min(a+b, math.MaxFloat64) }

// demandWeight is the weight of r's demand in band p at the band's
// current FairShare water level L: the weights of the clients granted less
// than they want, plus wants/L for each of the others (which a parent's
// division at L then gives exactly their wants).
func (r *resource) demandWeight(p int32) float64 {
	level, unsat, all := 0.0, 0.0, 0.0
	for _, h := range r.list {
		if h.prio != p {
			continue
		}
		all += h.weight
		if h.wants > 0 && h.share < h.wants {
			level = max(level, h.share/h.weight)
			unsat += h.weight
		}
	}
	if unsat == 0 { // everyone satisfied: the level is the highest want
		for _, h := range r.list {
			if h.prio == p {
				level = max(level, h.wants/h.weight)
			}
		}
	}
	w := unsat
	for _, h := range r.list {
		if h.prio == p && h.wants > 0 && h.share >= h.wants && level > 0 {
			w += h.wants / level
		}
	}
	if w == 0 {
		return all
	}
	return w
}

// capLease bounds a lease and refresh interval cut from r's capacity by
// the parent's leases, which they must not outlive; s.mu is held.
func (r *resource) capLease(lease, refresh time.Duration) (time.Duration, time.Duration) {
	if r.up == nil {
		return lease, refresh
	}
	for _, u := range r.up.bands {
		if l, ok := u.r.Lease(); ok {
			if left := time.Until(l.Expiry); left > 0 {
				lease = min(lease, left)
			}
			refresh = min(refresh, l.Refresh/2)
		}
	}
	// Ask again well before the lease ends, as a template's refresh
	// interval does: a refresh due at its very end arrives after it, when
	// the server no longer counts what the client holds.
	return lease, min(refresh, lease/2)
}

// Close stops a server with a parent from asking it for capacity and gives
// its leases back, waiting for the releases of resources given up before
// (each bounded by the parent client's request timeout and retries); it
// returns an error wrapping throttle.ErrUnavailable when no parent took
// the release. For a server without a parent it does nothing. Idempotent.
func (s *Server) Close() error {
	if s.parent == nil {
		return nil
	}
	s.parent.once.Do(func() { close(s.parent.stop) })
	return s.parent.close()
}

// abandon stops a server as a crash of its process would: a server with a
// parent stops asking it for capacity and gives no lease back (the parent
// counts them until they expire). The server answers requests still, so
// detach it from the network first. A new Server with the same
// configuration and parent client id is then the process restarted with
// its state lost. For simulations and tests. Idempotent.
func (s *Server) abandon() {
	if s.parent == nil {
		return
	}
	s.parent.once.Do(func() { close(s.parent.stop) })
	s.parent.abandon()
}

// sweep drops the resources the server's clients left every dropInterval
// until Close, so that a server in a tree stops asking its parent for
// them even when no request comes in.
func (s *Server) sweep() {
	t := time.NewTicker(dropInterval)
	defer t.Stop()
	for {
		select {
		case <-s.parent.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		s.drop(s.now.Now())
		s.mu.Unlock()
	}
}

// ParentErr reports a parent that refuses: for a server in a tree, an
// error wrapping throttle.ErrInvalid or ErrExhausted when the parent
// refused the last request of one of its priority bands or one resource
// in it (then also wrapping ErrResourceRefused), or
// throttle.ErrUnavailable when no parent replica answered it (the server
// then hands out what its unexpired leases, or the safe capacity, allow).
// nil otherwise, and for a server without a parent.
func (s *Server) ParentErr() error {
	if s.parent == nil {
		return nil
	}
	return s.parent.err()
}

// err returns the first error among the bands' last refreshes, a refusal
// before unavailability.
func (l *treeLink) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first error
	for _, cs := range l.band {
		for _, c := range cs {
			err := c.Err()
			if err == nil {
				err = c.refusal()
			}
			switch {
			case err == nil:
			case !errors.Is(err, throttle.ErrUnavailable):
				return err
			case first == nil:
				first = err
			}
		}
	}
	return first
}

// parentLease returns the lease the server holds from its parent on
// resource id in band 0, and whether it holds one.
func (s *Server) parentLease(id string) (Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[id]
	if r == nil || r.up == nil || r.up.bands[0] == nil {
		return Lease{}, false
	}
	return r.up.bands[0].r.Lease()
}

// bands returns the priority bands r asks its parent in, sorted; for tests.
func (r *resource) bands() []int32 {
	var out []int32
	if r.up != nil {
		for p := range r.up.bands {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
