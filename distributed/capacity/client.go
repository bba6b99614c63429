package capacity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// Mode says what a client uses once a lease has expired without a
// successful refresh (the servers cannot be reached, or refuse).
type Mode int

const (
	// Safe uses the resource's safe capacity, as last told by a server
	// (or set with WithSafeCapacity). The default.
	Safe Mode = iota
	// Optimistic keeps using the capacity of the last lease.
	Optimistic
	// Pessimistic uses nothing: capacity 0.
	Pessimistic
)

// ClientOption configures a Client.
type ClientOption func(*clientSettings)

type clientSettings struct {
	id      string
	inc     int64
	mode    Mode
	timeout time.Duration
	minGap  time.Duration
	retry   time.Duration
}

// WithClientID sets the client's id, which must be unique among all
// clients of the servers. By default it is host:pid:random.
func WithClientID(id string) ClientOption { return func(s *clientSettings) { s.id = id } }

// withIncarnation sets the client's incarnation (Request.Incarnation),
// by default its start time in Unix nanoseconds, for simulations that
// restart clients on a clock of their own. A client restarted under the
// same id with an incarnation not above its previous life's is answered
// Stale once and moves past it.
func withIncarnation(n int64) ClientOption { return func(s *clientSettings) { s.inc = n } }

// WithMode sets what the client uses after a lease expired (default Safe).
func WithMode(m Mode) ClientOption { return func(s *clientSettings) { s.mode = m } }

// WithRequestTimeout bounds each call to a server (default 5s).
func WithRequestTimeout(d time.Duration) ClientOption {
	return func(s *clientSettings) { s.timeout = d }
}

// WithMinRefreshGap is the shortest time between two refreshes that a
// change of wants or a new resource brings forward (default 1s).
func WithMinRefreshGap(d time.Duration) ClientOption { return func(s *clientSettings) { s.minGap = d } }

// WithRetry is the wait after a refresh that reached no server (default
// 1s), doubling with each further failure in a row up to 16 times. Each
// failure moves on to the next address.
func WithRetry(d time.Duration) ClientOption { return func(s *clientSettings) { s.retry = d } }

// Client holds leases on any number of resources for one process,
// refreshing all of them in one round trip to the master server. Give it
// the addresses of all the replicas: it follows redirects to the master
// and moves on to the next address when one fails. All methods are safe
// for concurrent use.
//
// Leases expire on the client's own monotonic clock, counted from when it
// sent the request that got them, so clock skew between hosts does not
// matter. Inside a testing/synctest bubble the client runs on virtual
// time.
type Client struct {
	t     Transport
	addrs []string
	set   clientSettings

	mu       sync.Mutex
	res      map[string]*Resource
	target   string
	next     int
	due      time.Time // next refresh
	lastTrip time.Time
	early    bool  // a refresh was asked for before due
	failures int   // refreshes in a row that got no lease
	err      error // of the last refresh
	closed   bool

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	inc atomic.Int64  // incarnation: the start time, or past a server's
	seq atomic.Uint64 // of the last call sent
}

// NewClient returns a client calling the servers at addrs through t, and
// starts its refresh goroutine; Close stops it. Errors wrap
// throttle.ErrInvalid.
func NewClient(t Transport, addrs []string, opts ...ClientOption) (*Client, error) {
	set := clientSettings{timeout: 5 * time.Second, minGap: time.Second, retry: time.Second}
	for _, o := range opts {
		o(&set)
	}
	switch {
	case t == nil:
		return nil, invalidf("nil transport")
	case len(addrs) == 0:
		return nil, invalidf("no server address")
	case len(set.id) > maxIDLen:
		return nil, invalidf("client id longer than %d bytes", maxIDLen)
	case set.mode < Safe || set.mode > Pessimistic:
		return nil, invalidf("unknown mode %d", set.mode)
	case set.timeout <= 0 || set.minGap < 0 || set.retry <= 0:
		return nil, invalidf("timeout and retry must be > 0, min refresh gap >= 0")
	}
	if set.id == "" {
		host, _ := os.Hostname()
		var b [6]byte
		_, _ = rand.Read(b[:])
		set.id = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		t: t, addrs: append([]string(nil), addrs...), set: set,
		res: map[string]*Resource{}, target: addrs[0],
		kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}),
	}
	if set.inc == 0 {
		set.inc = time.Now().UnixNano()
	}
	c.inc.Store(set.inc)
	go c.loop(ctx)
	return c, nil
}

// ID returns the client's id.
func (c *Client) ID() string { return c.set.id }

// Err returns why the last refresh got no answer: an error wrapping
// throttle.ErrInvalid or ErrExhausted when a server refused it,
// throttle.ErrUnavailable when none answered; nil after a refresh that
// got leases, and before the first.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// refusal returns the first refusal of one of the client's resources by
// the last refresh (an error wrapping ErrResourceRefused), nil if none.
func (c *Client) refusal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.res {
		if err := r.Err(); errors.Is(err, ErrResourceRefused) {
			return err
		}
	}
	return nil
}

// Close stops refreshing and gives back every lease. It returns an error
// wrapping throttle.ErrUnavailable when no server took the release (the
// leases then expire on their own).
func (c *Client) Close() error {
	if ids := c.halt(); len(ids) > 0 {
		return c.release(ids)
	}
	return nil
}

// abandon stops the client as a crash of its process would: it stops
// refreshing, its resources admit nothing more, and it gives no lease
// back, so that the servers count its leases until they expire. A new
// Client with the same WithClientID is then the process restarted with
// its state lost (a new incarnation). For simulations and tests; a
// Client abandoned or closed stays so.
func (c *Client) abandon() { c.halt() }

// halt stops the client's loop and shuts its resources, and returns the
// ids of those it had open; nil if it was stopped already.
func (c *Client) halt() []string {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ids := make([]string, 0, len(c.res))
	for id, r := range c.res {
		ids = append(ids, id)
		r.shut()
	}
	c.res = nil
	c.mu.Unlock()
	c.cancel()
	<-c.done
	return ids
}

// stamp returns the incarnation and the sequence number of a new call.
func (c *Client) stamp() (int64, uint64) { return c.inc.Load(), c.seq.Add(1) }

// adopt moves the client's incarnation past inc, a server's newest for
// the client's id (a previous process under the same id, on a clock that
// was ahead): the client's calls are then newer than that process's. An
// inc of the client's own means that a newer call of its own went first:
// it stays as it is, since a new incarnation makes the servers count its
// leases twice until they expire.
func (c *Client) adopt(inc int64) {
	for {
		old := c.inc.Load()
		if old >= inc || c.inc.CompareAndSwap(old, inc+1) {
			return
		}
	}
}

// release tells the master that the client gives back ids. Every try
// carries the sequence number stamped when the release was decided, so
// that a try arriving after a later call that took a resource again (the
// client reopened it) is older than that call and frees nothing.
func (c *Client) release(ids []string) error {
	return c.sendRelease(c.releaseRequest(ids))
}

// releaseRequest returns the release of ids, stamped now: sent later (in
// the background), it is still older than the calls the client makes
// from now on.
func (c *Client) releaseRequest(ids []string) *ReleaseRequest {
	req := &ReleaseRequest{Client: c.set.id, Resources: ids}
	req.Incarnation, req.Sequence = c.stamp()
	return req
}

// sendRelease sends req to the master, following redirects.
func (c *Client) sendRelease(req *ReleaseRequest) error {
	var err error
	for range 2*len(c.addrs) + 1 {
		c.mu.Lock()
		addr := c.target
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.set.timeout)
		var resp *Response
		resp, err = c.t.Release(ctx, addr, req)
		cancel()
		if err == nil && !resp.Redirect {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%w: capacity: %s is not the master", throttle.ErrUnavailable, addr)
		}
		c.follow(addr, resp)
	}
	return err
}

// follow picks the next address after a failed call to addr: the master
// named in resp, or the next address of the list.
func (c *Client) follow(addr string, resp *Response) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp != nil && resp.Master != "" && resp.Master != addr {
		c.target = resp.Master
		return
	}
	c.next = (c.next + 1) % len(c.addrs)
	c.target = c.addrs[c.next]
}

// add registers r and brings the next refresh forward.
func (c *Client) add(r *Resource) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return fmt.Errorf("%w: capacity: client closed", throttle.ErrClosed)
	case c.res[r.id] != nil:
		return invalidf("resource %q is already open on this client", r.id)
	case len(c.res) >= maxRequestResources:
		return invalidf("a client holds at most %d resources", maxRequestResources)
	}
	c.res[r.id] = r
	c.poke()
	return nil
}

// poke asks the loop for an early refresh. Call with c.mu held.
func (c *Client) poke() {
	c.early = true
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Client) remove(r *Resource) error {
	req := c.detach(r)
	if req == nil {
		return nil
	}
	return c.sendRelease(req)
}

// open returns how many resources the client has open.
func (c *Client) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.res)
}

// detach stops refreshing r and returns the release of its lease,
// stamped before any call that may carry r's id again (one reopening it);
// nil if r was not open.
func (c *Client) detach(r *Resource) *ReleaseRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.res[r.id] != r {
		return nil
	}
	delete(c.res, r.id)
	return c.releaseRequest([]string{r.id})
}

func (c *Client) loop(ctx context.Context) {
	defer close(c.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(c.step(ctx))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-c.kick:
		}
	}
}

// dueLocked returns when the next refresh is due: at the regular time, or
// earlier when asked for, but not within the minimum gap of the last one.
func (c *Client) dueLocked() time.Time {
	if c.early {
		if e := c.lastTrip.Add(c.set.minGap); e.Before(c.due) {
			return e
		}
	}
	return c.due
}

// step refreshes when due, applies expiries, and returns how long to
// sleep.
func (c *Client) step(ctx context.Context) time.Duration {
	now := time.Now()
	c.mu.Lock()
	rs := make([]*Resource, 0, len(c.res))
	for _, r := range c.res {
		rs = append(rs, r)
	}
	due := c.dueLocked()
	c.mu.Unlock()
	if len(rs) > 0 && !now.Before(due) {
		c.refresh(ctx, rs, now)
		now = time.Now()
	}
	wait := time.Hour
	c.mu.Lock()
	if len(c.res) > 0 {
		wait = c.dueLocked().Sub(now)
	}
	c.mu.Unlock()
	for _, r := range rs {
		if e, ok := r.expire(now); ok {
			wait = min(wait, e.Sub(now))
		}
	}
	return max(wait, time.Millisecond)
}

// refresh asks for all of rs in one request, following redirects and
// moving through the addresses on failure. Each attempt reports what the
// client holds when it is sent, and a grant counts from then.
func (c *Client) refresh(ctx context.Context, rs []*Resource, now time.Time) {
	req, asked := c.request(rs, now)
	c.mu.Lock()
	c.lastTrip = now
	c.early = false
	// Until a server answers: the retry wait, doubling with each failed
	// refresh in a row up to 16 times, so that clients do not flood a
	// recovering server.
	c.failures++
	c.due = now.Add(c.set.retry << min(c.failures-1, 4))
	c.mu.Unlock()
	if len(req.Resources) == 0 {
		return
	}
	err := c.ask(ctx, req, asked)
	if err != nil {
		for _, r := range asked {
			r.setErr(err)
		}
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// request is the request for rs at now, and the resources it asks for: a
// resource whose demand a server would refuse stays out of it, so that it
// cannot fail the others'.
func (c *Client) request(rs []*Resource, now time.Time) (*Request, []*Resource) {
	req := &Request{Client: c.set.id, Resources: make([]ResourceRequest, 0, len(rs))}
	asked := make([]*Resource, 0, len(rs))
	for _, r := range rs {
		rr := r.request(now)
		if err := rr.check(); err != nil {
			r.setErr(err)
			continue
		}
		req.Resources = append(req.Resources, rr)
		asked = append(asked, r)
	}
	return req, asked
}

// ask sends req for asked to the master, following redirects, trying at
// most twice as many times as there are servers (and once more), and
// applies the grants of the first answer. It returns the last call's
// error, nil once grants are applied.
func (c *Client) ask(ctx context.Context, req *Request, asked []*Resource) (err error) {
	for try := range 2*len(c.addrs) + 1 {
		if ctx.Err() != nil {
			return err
		}
		sent := time.Now()
		if try > 0 {
			for i, r := range asked {
				req.Resources[i].Has, req.Resources[i].Token = r.holds(sent)
			}
		}
		req.Incarnation, req.Sequence = c.stamp()
		c.mu.Lock()
		addr := c.target
		c.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, c.set.timeout)
		var resp *Response
		resp, err = c.t.GetCapacity(cctx, addr, req)
		cancel()
		if err == nil && resp.Stale {
			// An older process under this id was heard later than this
			// one: move past it, and ask again.
			c.adopt(resp.Incarnation)
			err = fmt.Errorf("%w: capacity: %s: %w", throttle.ErrUnavailable, addr, errStale)
			continue
		}
		if err != nil || resp.Redirect {
			if errors.Is(err, throttle.ErrInvalid) || errors.Is(err, ErrExhausted) || errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrForbidden) {
				return err // the request itself is refused: retry later
			}
			if err == nil {
				err = fmt.Errorf("%w: capacity: %s is not the master", throttle.ErrUnavailable, addr)
			}
			c.follow(addr, resp)
			continue
		}
		c.apply(resp, sent)
		return nil
	}
	return err
}

// apply takes the grants of resp to a request sent at sent, and moves the
// next refresh to the soonest one they ask for.
func (c *Client) apply(resp *Response, sent time.Time) {
	refresh := time.Duration(math.MaxInt64)
	for _, g := range resp.Grants {
		c.mu.Lock()
		r := c.res[g.Resource]
		c.mu.Unlock()
		if r == nil {
			continue
		}
		if g.Err != nil {
			r.setErr(g.Err) // refused alone: the others were served
			continue
		}
		if !validGrant(g) {
			continue
		}
		r.grant(g, sent)
		refresh = min(refresh, g.Refresh)
	}
	if refresh != time.Duration(math.MaxInt64) {
		c.mu.Lock()
		c.due = sent.Add(refresh)
		c.failures = 0
		c.mu.Unlock()
	}
}

// MaxLease is the longest lease a client accepts.
const MaxLease = 24 * time.Hour

// validGrant refuses leases no server should send.
func validGrant(g Grant) bool {
	return g.Capacity >= 0 && !math.IsInf(g.Capacity, 0) && g.Lease > 0 && g.Lease <= MaxLease &&
		g.Refresh > 0 && g.SafeCapacity >= 0 && !math.IsInf(g.SafeCapacity, 0)
}
