package capacity

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Lease is what a client holds on a resource.
type Lease struct {
	// Capacity is the granted capacity.
	Capacity float64
	// Expiry is when the lease ends, on this process's monotonic clock.
	Expiry time.Time
	// Refresh is the refresh interval the server asked for.
	Refresh time.Duration
}

// ResourceOption configures a resource of a Client.
type ResourceOption func(*resourceSettings)

type resourceSettings struct {
	prio     int32
	weight   float64
	safe     float64
	burst    time.Duration
	estimate bool
}

// WithPriority sets the client's priority band on the resource (default
// 0); higher bands are served first.
func WithPriority(p int32) ResourceOption { return func(s *resourceSettings) { s.prio = p } }

// WithWeight sets the client's weight in sharing, in (0, 2²⁰] (default 1).
func WithWeight(w float64) ResourceOption { return func(s *resourceSettings) { s.weight = w } }

// WithSafeCapacity sets the capacity a client in Safe mode uses before a
// server has told it the resource's safe capacity (default 0).
func WithSafeCapacity(c float64) ResourceOption { return func(s *resourceSettings) { s.safe = c } }

// WithBurstWindow sets, for a rate resource, how much of the lease may be
// used at once: burst = max(2, capacity·d) (default 100ms).
func WithBurstWindow(d time.Duration) ResourceOption {
	return func(s *resourceSettings) { s.burst = d }
}

// WithEstimatedWants makes a rate resource ask for the rate at which it is
// asked for units (admitted or not), smoothed over refreshes, instead of
// a fixed wants; the wants given when opening it is the first estimate.
func WithEstimatedWants() ResourceOption { return func(s *resourceSettings) { s.estimate = true } }

// Resource is a client's handle on one resource: its lease, the capacity
// the client may use now, and notifications when that changes. All
// methods are safe for concurrent use.
type Resource struct {
	c   *Client
	id  string
	set resourceSettings

	mu       sync.Mutex
	wants    float64
	lease    Lease
	leased   bool // lease is unexpired
	hadLease bool
	safe     float64
	limit    float64
	changes  chan float64
	wake     chan struct{} // closed when limit changes
	apply    func(float64)
	estimate func(now time.Time) float64
	has      func() float64 // at least what the client holds (a server in a tree: what its clients hold)
	counted  time.Time      // until when a server may count the last lease: its arrival plus its length
	// carried is, of has, what was held when no server counted a lease
	// any more (a gauge: when its lease lapsed) and is still held, as
	// float64 bits: lowered to has at each report and, for a gauge, by the
	// units released that were taken before (see GaugeResource.Release),
	// so that it never counts a unit taken since.
	carried atomic.Uint64
	onLapse func()      // a gauge's: marks the units it holds as carried; r.mu is held
	timer   *time.Timer // ends the lease at its expiry
	token   []byte      // the lease's Grant.Token
	lapsed  time.Time   // the expiry of the last lease that ran out before a new one came
	err     error       // why the last refresh granted no lease
	closed  atomic.Bool
}

func checkWants(w float64) error {
	if !(w >= 0) || math.IsInf(w, 0) {
		return invalidf("wants must be finite and >= 0, got %v", w)
	}
	return nil
}

func (c *Client) newResource(id string, wants float64, opts []ResourceOption) (*Resource, error) {
	set := resourceSettings{weight: 1, burst: 100 * time.Millisecond}
	for _, o := range opts {
		o(&set)
	}
	switch {
	case id == "" || len(id) > maxIDLen:
		return nil, invalidf("resource id must have 1 to %d bytes, got %d", maxIDLen, len(id))
	case !(set.weight > 0) || set.weight > maxWeightValue:
		return nil, invalidf("weight must be in (0, %d], got %v", maxWeightValue, set.weight)
	case !(set.safe >= 0) || math.IsInf(set.safe, 0):
		return nil, invalidf("safe capacity must be finite and >= 0, got %v", set.safe)
	case set.burst <= 0:
		return nil, invalidf("burst window must be > 0, got %v", set.burst)
	}
	if err := checkWants(wants); err != nil {
		return nil, err
	}
	r := &Resource{c: c, id: id, set: set, wants: wants, safe: set.safe, changes: make(chan float64, 1), wake: make(chan struct{})}
	r.limit = r.fallback()
	return r, nil
}

// Resource opens resource id with a fixed wants (change it with
// SetWants) and returns its handle; the client asks for it at once. Until
// the first grant the resource has the capacity its mode gives an expired
// lease. Errors wrap throttle.ErrInvalid (bad argument, id already open)
// or throttle.ErrClosed.
func (c *Client) Resource(id string, wants float64, opts ...ResourceOption) (*Resource, error) {
	r, err := c.newResource(id, wants, opts)
	if err != nil {
		return nil, err
	}
	return r, c.add(r)
}

// ID returns the resource id.
func (r *Resource) ID() string { return r.id }

// Lease returns the current lease, and false if there is none (never
// granted, or expired).
func (r *Resource) Lease() (Lease, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked(time.Now())
	return r.lease, r.leased
}

// Capacity returns the capacity the client may use now: the lease's, or
// from the lease's expiry on what the client's mode says. The resource's
// limiter follows it: a timer ends the lease at its expiry, whatever the
// refresh is doing.
func (r *Resource) Capacity() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked(time.Now())
	return r.limit
}

// Changes returns a channel that receives the new capacity whenever it
// changes. It holds only the latest value: a reader that falls behind
// sees the current capacity, never a backlog, and the client never
// blocks on it.
func (r *Resource) Changes() <-chan float64 { return r.changes }

// Wants returns what the client asks for.
func (r *Resource) Wants() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wants
}

// SetWants changes what the client asks for; the client refreshes soon
// (at most once per minimum refresh gap). Errors wrap throttle.ErrInvalid
// (NaN, infinite or negative) or throttle.ErrClosed.
func (r *Resource) SetWants(w float64) error {
	if err := checkWants(w); err != nil {
		return err
	}
	if r.closed.Load() {
		return fmt.Errorf("%w: capacity: resource %q closed", throttle.ErrClosed, r.id)
	}
	r.mu.Lock()
	changed := r.wants != w
	r.wants = w
	r.mu.Unlock()
	if changed {
		r.c.mu.Lock()
		r.c.poke()
		r.c.mu.Unlock()
	}
	return nil
}

// setDemand changes what the resource asks for: wants, in band prio, with
// weight; the client refreshes soon if it changed.
func (r *Resource) setDemand(wants, weight float64, prio int32) {
	r.mu.Lock()
	changed := r.wants != wants || r.set.weight != weight || r.set.prio != prio
	r.wants, r.set.weight, r.set.prio = wants, weight, prio
	r.mu.Unlock()
	if changed {
		r.c.mu.Lock()
		r.c.poke()
		r.c.mu.Unlock()
	}
}

// Close gives the lease back and stops refreshing the resource. Errors
// wrap throttle.ErrUnavailable when no server took the release.
func (r *Resource) Close() error {
	if r.closed.Load() {
		return nil
	}
	r.shut()
	return r.c.remove(r)
}

func (r *Resource) shut() {
	r.closed.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.leased = false
	r.setLimit(0)
}

// request returns the resource's part of a refresh.
func (r *Resource) request(now time.Time) ResourceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.estimate != nil {
		r.wants = r.estimate(now)
	}
	has, tok := r.holdsLocked(now)
	return ResourceRequest{Resource: r.id, Wants: r.wants, Priority: r.set.prio, Weight: r.set.weight, Has: has, Token: tok}
}

// Err returns why the last refresh got no lease for the resource: its
// demand was invalid (the client left it out of the request, and the
// other resources were asked for), or the request was refused or not
// answered (see Client.Err). It is nil once a lease has been granted.
func (r *Resource) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Resource) setErr(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// holds returns what the client holds at now, for a request's Has, and
// the token of its lease (nil without one).
func (r *Resource) holds(now time.Time) (float64, []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holdsLocked(now)
}

func (r *Resource) holdsLocked(now time.Time) (float64, []byte) {
	held := 0.0
	if r.has != nil {
		held = r.has()
	}
	carried := r.lowerCarried(held)
	switch {
	case r.leased && now.Before(r.lease.Expiry):
		return max(r.lease.Capacity, held-carried), r.token
	case now.Before(r.counted) || r.onLapse != nil:
		// A server may count them still; a gauge left out those it
		// held when its lease lapsed.
		return held - carried, nil
	}
	// Units kept past the end of every count of the lease they were
	// taken under come on top by design and are not reported: a
	// learning server would confirm them as a lease that the others'
	// leases already cover. A unit released while this runs lowers
	// what has says after the store: read again, and keep the lower.
	r.carried.Store(math.Float64bits(held))
	if r.has != nil {
		r.lowerCarried(r.has())
	}
	return 0, nil
}

// lowerCarried lowers the carried count to at most v and returns it.
func (r *Resource) lowerCarried(v float64) float64 {
	for {
		old := r.carried.Load()
		c := math.Float64frombits(old)
		if c <= v || r.carried.CompareAndSwap(old, math.Float64bits(v)) {
			return min(c, v)
		}
	}
}

// released lowers the carried count by n units given back that may have
// been carried. Lock-free; nothing to do while no unit is carried.
func (r *Resource) released(n int) {
	for {
		old := r.carried.Load()
		if old == 0 {
			return
		}
		c := max(math.Float64frombits(old)-float64(n), 0)
		if r.carried.CompareAndSwap(old, math.Float64bits(c)) {
			return
		}
	}
}

// grant applies a lease asked for at sent, and arms the timer that ends
// it: the lease is counted from when the request left, so it ends here no
// later than where the server counts it, and it ends on time even while
// a refresh hangs.
func (r *Resource) grant(g Grant, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = nil
	if r.closed.Load() {
		return
	}
	if r.leased && !time.Now().Before(r.lease.Expiry) {
		r.lapse() // ran out as the new one came
	}
	r.lease = Lease{Capacity: g.Capacity, Expiry: sent.Add(g.Lease), Refresh: g.Refresh}
	r.counted = time.Now().Add(2 * g.Lease)
	r.token = g.Token
	r.leased, r.hadLease = true, true
	r.safe = g.SafeCapacity
	left := time.Until(r.lease.Expiry)
	if r.expireLocked(time.Now()) {
		return // it took longer than the lease to arrive: never applied
	}
	r.setLimit(g.Capacity)
	if r.timer == nil {
		r.timer = time.AfterFunc(left, func() { r.expire(time.Now()) })
	} else {
		r.timer.Reset(left)
	}
}

// expire ends the lease if it ran out by now; otherwise it returns its
// expiry.
func (r *Resource) expire(now time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.leased || r.expireLocked(now) {
		return time.Time{}, false
	}
	return r.lease.Expiry, true
}

// expireLocked ends the lease if it ran out by now, and reports whether
// it did. Call with r.mu held.
func (r *Resource) expireLocked(now time.Time) bool {
	if !r.leased || now.Before(r.lease.Expiry) {
		return false
	}
	r.leased = false
	r.lapse()
	if !r.closed.Load() {
		r.setLimit(r.fallback())
	}
	return true
}

// lapse records that the lease ran out before a new one came: a gauge
// leaves the units it holds now out of its reports from then on, so that
// no grant after the lapse makes them count again (a learning server
// would confirm them as a lease that the others' leases already cover).
// Call with r.mu held.
func (r *Resource) lapse() {
	r.lapsed = r.lease.Expiry
	if r.onLapse != nil {
		r.onLapse()
	}
}

// fallback is the capacity without a lease. Call with r.mu held.
func (r *Resource) fallback() float64 {
	switch r.c.set.mode {
	case Optimistic:
		if r.hadLease {
			return r.lease.Capacity
		}
		return r.safe
	case Pessimistic:
		return 0
	}
	return r.safe
}

// setLimit changes the capacity in use. Call with r.mu held.
func (r *Resource) setLimit(v float64) {
	if v == r.limit {
		return
	}
	r.limit = v
	if r.apply != nil {
		r.apply(v)
	}
	select {
	case <-r.changes:
	default:
	}
	r.changes <- v // cannot block: r.mu is held and the buffer is empty
	close(r.wake)
	r.wake = make(chan struct{})
}

func (r *Resource) wakeCh() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wake
}

func (r *Resource) closedErr() error {
	return fmt.Errorf("%w: capacity: resource %q closed", throttle.ErrClosed, r.id)
}

// RateResource is a resource whose capacity is a rate (units per
// second), upheld by a token bucket whose rate and burst follow the
// lease. It is a throttle.Limiter and throttle.Reserver (the key is
// ignored). All methods are safe for concurrent use.
type RateResource struct {
	*Resource
	b      *tokenbucket.Bucket
	zero   atomic.Bool
	asked  atomic.Int64
	last   time.Time
	smooth float64
}

var (
	_ throttle.Limiter  = (*RateResource)(nil)
	_ throttle.Reserver = (*RateResource)(nil)
	_ throttle.Limiter  = (*GaugeResource)(nil)
)

// Rate opens rate resource id wanting wants units per second. See
// Resource for errors.
func (c *Client) Rate(id string, wants float64, opts ...ResourceOption) (*RateResource, error) {
	r, err := c.newResource(id, wants, opts)
	if err != nil {
		return nil, err
	}
	b, err := tokenbucket.NewBucket(throttle.PerSecond(1), 2)
	if err != nil {
		return nil, err
	}
	rr := &RateResource{Resource: r, b: b, smooth: wants}
	r.apply = rr.applyRate
	rr.applyRate(r.limit)
	if r.set.estimate {
		r.estimate = rr.estimateWants
	}
	return rr, c.add(r)
}

// maxRate bounds the rate a lease can set.
const maxRate = float64(bridge.MaxPerSecond)

func (rr *RateResource) applyRate(v float64) {
	v = min(v, maxRate)
	count := math.Floor(v * 1000) // per 1000 s: millihertz steps, rounded down
	if count < 1 {
		rr.zero.Store(true)
		return
	}
	burst := max(2, int(v*rr.set.burst.Seconds()))
	// Neither call can fail: the rate and burst are within bounds.
	_ = rr.b.SetRate(throttle.NewRate(int(count), 1000*time.Second))
	_ = rr.b.SetBurst(burst)
	rr.zero.Store(false)
}

// estimateWants returns the smoothed rate of units asked for since the
// last refresh. Called with r.mu held.
func (rr *RateResource) estimateWants(now time.Time) float64 {
	n := rr.asked.Swap(0)
	if !rr.last.IsZero() {
		if dt := now.Sub(rr.last).Seconds(); dt > 0 {
			rr.smooth = 0.5*rr.smooth + 0.5*float64(n)/dt
		}
	}
	rr.last = now
	return rr.smooth
}

// Allow admits n units now if the lease's rate allows. The key is
// ignored. With a zero capacity it denies everything; RetryAfter is the
// time until the next refresh. Errors wrap throttle.ErrInvalid,
// throttle.ErrExceedsLimit (n above the burst) or throttle.ErrClosed.
func (rr *RateResource) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if wait, done, err := rr.admit(n); done {
		return throttle.Decision{RetryAfter: wait}, err
	}
	return rr.b.Allow(ctx, key, n)
}

// Reserve books n units at the earliest time the lease's rate allows,
// within maxWait. With a zero capacity nothing is booked.
func (rr *RateResource) Reserve(ctx context.Context, key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	if wait, done, err := rr.admit(n); done {
		return throttle.Reservation{Delay: wait}, err
	}
	return rr.b.Reserve(ctx, key, n, maxWait)
}

// admit counts a call for n units in the demand the lease is asked for,
// and reports whether the call is answered without the bucket: the
// resource is closed (err wraps throttle.ErrClosed), or its capacity is
// zero, when the call waits until the next refresh (err wraps
// throttle.ErrInvalid for n <= 0).
func (rr *RateResource) admit(n int) (wait time.Duration, done bool, err error) {
	if rr.closed.Load() {
		return 0, true, rr.closedErr()
	}
	if n > 0 {
		rr.asked.Add(int64(n))
	}
	if !rr.zero.Load() {
		return 0, false, nil
	}
	if n <= 0 {
		return 0, true, invalidf("n must be > 0, got %d", n)
	}
	return rr.untilRefresh(), true, nil
}

func (rr *RateResource) untilRefresh() time.Duration {
	rr.c.mu.Lock()
	defer rr.c.mu.Unlock()
	return max(time.Until(rr.c.dueLocked()), 0)
}

// GaugeResource is a resource whose capacity is a number of units in use
// at once (such as transactions in flight), upheld by a counting
// semaphore whose limit follows the lease (rounded down). Units already
// held are not taken back when the limit drops: each refresh reports that
// the client holds the larger of its lease and its units in flight, and
// the server counts a lowered lease at its old size for as long as the
// units exceed the new one, so that the units the clients hold add up to
// at most the capacity while they reach the servers. Units held when the
// lease lapses (the servers could not be reached in time) are left out
// of the reports from then on, until released. All methods are safe for
// concurrent use; Release and the release funcs are lock-free.
type GaugeResource struct {
	*Resource
	s     *counting.Semaphore
	zero  atomic.Bool
	lapse atomic.Uint64 // lapses of the lease so far: a unit taken before the last one was carried
}

// Gauge opens gauge resource id wanting wants units at once. See
// Resource for errors.
func (c *Client) Gauge(id string, wants float64, opts ...ResourceOption) (*GaugeResource, error) {
	r, err := c.newResource(id, wants, opts)
	if err != nil {
		return nil, err
	}
	s, err := counting.NewSemaphore(1)
	if err != nil {
		return nil, err
	}
	g := &GaugeResource{Resource: r, s: s}
	r.apply = g.applyLimit
	// Units held are not taken back when the limit drops: the client
	// holds the larger of its lease and them.
	r.has = func() float64 { return float64(s.InFlight()) }
	r.onLapse = g.carry
	g.applyLimit(r.limit)
	return g, c.add(r)
}

func (g *GaugeResource) applyLimit(v float64) {
	l := math.Floor(min(v, float64(counting.MaxLimit)))
	if l < 1 {
		g.zero.Store(true)
		return
	}
	_ = g.s.SetLimit(int(l)) // cannot fail: l is within bounds
	g.zero.Store(false)
}

// TryHold takes n units if they fit under the limit now; the key is
// ignored. When the Decision is Allowed, release gives the units back
// (only its first call counts); when denied, release does nothing. With a
// zero capacity it denies everything. Errors wrap throttle.ErrClosed,
// throttle.ErrInvalid or throttle.ErrExceedsLimit.
func (g *GaugeResource) TryHold(ctx context.Context, key string, n int) (d throttle.Decision, release func(), err error) {
	if done, err := g.refuses(n); done {
		return throttle.Decision{}, noRelease, err
	}
	lapses := g.lapse.Load()
	if d, err = g.s.Allow(ctx, key, n); err != nil || !d.Allowed {
		return d, noRelease, err
	}
	return d, g.releaser(n, lapses), nil
}

// releaser returns the release of n units taken when the lease had
// lapsed lapses times: only its first call gives them back, and lowers
// the carried count if they were taken before the last lapse.
func (g *GaugeResource) releaser(n int, lapses uint64) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			_ = g.s.Release(n) // cannot fail: these n units are held
			if g.lapse.Load() != lapses {
				g.released(n)
			}
		}
	}
}

// carry marks the units held now as carried: the lease lapsed. The
// resource's lock is held.
func (g *GaugeResource) carry() {
	g.lapse.Add(1)
	g.carried.Store(math.Float64bits(float64(g.s.InFlight())))
}

// Hold waits until n units fit, or ctx is done; the key is ignored. The
// returned release gives them back (only its first call counts). Errors
// wrap throttle.ErrClosed, throttle.ErrInvalid, throttle.ErrExceedsLimit,
// or ctx's error.
func (g *GaugeResource) Hold(ctx context.Context, key string, n int) (release func(), err error) {
	for {
		if g.closed.Load() {
			return nil, g.closedErr()
		}
		wake := g.wakeCh()
		if !g.zero.Load() {
			lapses := g.lapse.Load()
			if _, err := g.s.Hold(ctx, key, n); err != nil {
				return nil, err
			}
			return g.releaser(n, lapses), nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Release gives back n units taken with Allow. Errors wrap
// throttle.ErrInvalid (n <= 0, or more than are held: nothing is released).
// Units given back this way are not told apart: any of them may have been
// carried past a lapse of the lease, and they lower the carried count (a
// fresh unit released leaves a carried one reported, never the other way
// round); the release funcs of TryHold and Hold know which they give back.
func (g *GaugeResource) Release(n int) error {
	if err := g.s.Release(n); err != nil {
		return err
	}
	g.released(n)
	return nil
}

// InFlight returns the units held now.
func (g *GaugeResource) InFlight() int { return g.s.InFlight() }

// Allow takes n units if they fit now (release them with Release); the
// key is ignored.
func (g *GaugeResource) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if done, err := g.refuses(n); done {
		return throttle.Decision{}, err
	}
	return g.s.Allow(ctx, key, n)
}

// refuses reports whether a call for n units is answered without the
// semaphore: the resource is closed (err wraps throttle.ErrClosed), or its
// capacity is zero and the call is denied (err wraps throttle.ErrInvalid
// for n <= 0).
func (g *GaugeResource) refuses(n int) (done bool, err error) {
	if g.closed.Load() {
		return true, g.closedErr()
	}
	if !g.zero.Load() {
		return false, nil
	}
	if n <= 0 {
		return true, invalidf("n must be > 0, got %d", n)
	}
	return true, nil
}

func noRelease() {}
