// Package slidingwindow is a sliding-window rate limiter in two forms,
// both lock-free (one compare-and-swap per decision), allocation-free and
// reading the clock once per decision.
//
//	l, err := slidingwindow.New(100, time.Minute) // per key: about 100 in any minute
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	d, err := l.Allow(ctx, userID, 1)
//
// # Weighted two-window estimate (New, NewWindow)
//
// Time is cut into aligned windows of length W. The limiter keeps the count
// of the current window (cur) and of the previous one (prev), and admits n
// units at elapsed time e into the current window when the estimate of the
// units in the sliding window (t-W, t],
//
//	prev·(W-e)/W + cur + n ≤ limit,
//
// holds, computed exactly in 128-bit integers. It assumes prev was spread
// evenly over its window. The window index and both counts fit one int64,
// so limit is at most MaxLimit (2^24-1).
//
// Guarantees of the weighted form, for the half-open sliding window
// (t-W, t] holding C units and the estimate E = prev·(W-e)/W + cur:
//
//   - each aligned window admits at most limit units (E ≥ cur);
//   - E - C lies in [-prev·e/W, prev·(W-e)/W]. So at the moment of an
//     admission C + n ≤ limit + prev·e/W: it over-admits, compared with an
//     exact sliding log, by less than prev (≤ limit) units — when the
//     previous window's units all came at its very end. Any interval of
//     length W holds at most 2·limit-1 units, and a trace that reaches
//     2·limit-1 exists (it is in the tests). Conversely a denial means
//     C + n > limit - prev·(W-e)/W: it under-admits, when the previous
//     window's units came early, by at most prev·(W-e)/W units, a shortfall
//     that shrinks to nothing by the end of the window;
//   - the estimate is continuous at window boundaries and never increases
//     without an admission, so RetryAfter is exact to the nanosecond: the
//     same request is denied 1 ns before it and admitted at it.
//
// # Slotted ring (NewSlotted, NewSlottedWindow)
//
// The window is split into k slots of W/k each, and a request is admitted
// when the units counted in the current slot and the k-1 before it, plus
// n, are at most limit. Guarantees of the slotted form:
//
//   - every interval of length W - W/k holds at most limit units: the ring
//     is at least as strict as an exact sliding log of window W - W/k;
//   - it never denies a request that an exact sliding log of window W
//     would admit (given the same history);
//   - so its error is confined to the last slot, W/k, and shrinks as k
//     grows. With k = 1 it is a fixed window. Any interval of length W
//     can still hold up to 2·limit units (limit at the end of one slot,
//     limit in the slot k later), but only in a span longer than W - W/k.
//
// The current slot's index and count and the running total live in one
// int64 updated by CAS; the counts of the k-1 previous slots live in a ring
// of per-slot atomic words tagged with their slot index, written before the
// CAS that moves the state past the slot (racing writers keep the largest
// count, and never overwrite a newer slot). A decision costs O(1) within a
// slot; the first one in a new slot sums the ring entries still in the
// window (at most k-1 atomic loads, once per slot), and a denial reads the
// ring to compute RetryAfter exactly (O(k) at worst, O(1) when the units
// that must leave are all in the newest slot).
//
// # Limits and clock
//
// limit may be up to MaxLimit, window up to 366 days, and slots up to
// 65536, dividing the window into whole nanoseconds. Window and slot
// indexes are kept modulo 2^(63-2·bitlen(limit)): 2^49 for a limit of 100,
// 2^15 at MaxLimit. A Window left untouched for about a multiple of that
// many windows (slots) may take its old counts for current for at most
// max(2 windows or slots, 1 s): it can only deny more, never admit more.
//
// A request whose clock reading is older than the window (slot) another
// goroutine already moved the state to is counted in that newer one, as
// of its start: this keeps the bounds when goroutines read the clock in
// one order and update the state in another (RetryAfter is then measured
// from the newer window). The bounds hold for a clock that never steps
// back by more than max(2 windows or slots, 1 s) (the default clock is
// monotonic); a state found further ahead than that is taken as stale and
// restarts empty.
package slidingwindow

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/window"
)

// Bounds of the constructor arguments.
const (
	// MaxLimit is the largest limit: both counts of the weighted form and
	// the total and slot count of the slotted form share one int64 with
	// the window index.
	MaxLimit = 1<<24 - 1
	// maxWindow is the longest window.
	maxWindow = bridge.MaxPeriod
	// maxSlots is the largest number of slots of the slotted form.
	maxSlots = 1 << 16
)

var errZero = fmt.Errorf("%w: zero slidingwindow limiter: use the constructor", throttle.ErrInvalid)

// config is the immutable configuration shared by every state of a
// limiter.
type config struct {
	limit  int64
	window int64
	slots  int64          // 0: weighted form
	slot   int64          // slotted: slot length, window/slots
	div    window.Divisor // by window (weighted) or slot (slotted)
	lay    window.Layout  // weighted: index, prev, cur; slotted: slot, total, cur
	rlay   window.Layout  // slotted ring entries: slot, count
	skew   int64          // see window.Layout.Skew, in windows or slots
}

// Params is what the shared Limits and Algorithm read of c.
func (c *config) Params() window.Params {
	return window.Params{Limit: c.limit, Window: c.window, Max: c.lay.Max()}
}

// The configuration as the keyed limiter's Limits and the Algorithm see
// it: the parts this package shares with the other window package.
type (
	limits    = window.Limits[config, *config]
	algorithm = window.Algorithm[config, *config]
)

func newConfig(limit int, w time.Duration, slots int) (*config, error) {
	switch {
	case limit <= 0 || limit > MaxLimit:
		return nil, fmt.Errorf("%w: slidingwindow: limit %d out of range [1, %d]", throttle.ErrInvalid, limit, MaxLimit)
	case w <= 0 || w > maxWindow:
		return nil, fmt.Errorf("%w: slidingwindow: window %v out of range (0, %v]", throttle.ErrInvalid, w, maxWindow)
	case slots < 0 || slots > maxSlots:
		return nil, fmt.Errorf("%w: slidingwindow: %d slots out of range [1, %d]", throttle.ErrInvalid, slots, maxSlots)
	case slots > 0 && int64(w)%int64(slots) != 0:
		return nil, fmt.Errorf("%w: slidingwindow: window %v is not a whole number of nanoseconds times %d slots", throttle.ErrInvalid, w, slots)
	}
	c := &config{limit: int64(limit), window: int64(w), slots: int64(slots)}
	c.lay, _ = window.NewLayout(c.limit, 2) // MaxLimit leaves MinTagBits
	if slots == 0 {
		c.skew = c.lay.Skew(c.window)
		c.div = window.NewDivisor(c.window)
	} else {
		c.slot = c.window / c.slots
		c.div = window.NewDivisor(c.slot)
		c.rlay, _ = window.NewLayout(c.limit, 1)
		c.skew = c.lay.Skew(c.slot)
	}
	return c, nil
}

// WithLimit returns a copy of c with another limit, in the same layout,
// so that the words c wrote keep their meaning.
func (c *config) WithLimit(limit int) (*config, error) {
	if limit <= 0 || int64(limit) > c.lay.Max() {
		return nil, fmt.Errorf("%w: slidingwindow: SetLimit(%d): want 1 to %d, what the counters sized at New hold", throttle.ErrInvalid, limit, c.lay.Max())
	}
	nc := *c
	nc.limit = int64(limit)
	return &nc, nil
}

func (c *config) CheckN(n int) error {
	if n <= 0 || int64(n) > c.limit {
		return limiterkit.CheckN(n, int(c.limit))
	}
	return nil
}

// decideWeighted admits or denies n units at now on the weighted state
// word w, and returns what the Decision is made of (see stepWeighted).
// live is false if the state is dead.
func (c *config) decideWeighted(w *atomic.Int64, now, n int64) (ok bool, start, prev, cur, used int64, live bool) {
	for {
		old := w.Load()
		if old == window.Dead {
			return false, 0, 0, 0, 0, false
		}
		next, ok, start, prev, cur, used := c.stepWeighted(old, now, n)
		if !ok || w.CompareAndSwap(old, next) {
			return ok, start, prev, cur, used, true
		}
	}
}

// stepWeighted is the weighted decision as a pure function of the live
// state word old: whether n units are admitted, the word to store if so,
// the start of the window decided in, its counts before the request, and
// the units they weigh at now: cur + ⌈prev·(W-e)/W⌉ at the offset e.
func (c *config) stepWeighted(old, now, n int64) (next int64, ok bool, start, prev, cur, used int64) {
	idx, _ := c.div.FloorDiv(now)
	prev, cur, at := c.lay.Hi(old), c.lay.Lo(old), idx
	switch d := c.lay.Since(old, idx); {
	case d == 0:
	case d == 1:
		prev, cur = cur, 0
	case d < 0 && d >= -c.skew && prev+cur > 0:
		at -= d // a later window, opened by a caller with a later clock reading
	default:
		prev, cur = 0, 0
	}
	start = at * c.window
	e := max(now-start, 0) // in a later window: as of its start
	used = cur
	if prev > 0 {
		used += c.div.CeilMulDiv(prev, c.window-e)
	}
	if used+n > c.limit {
		return old, false, start, prev, cur, used
	}
	return c.lay.Pack2(at, prev, cur+n), true, start, prev, cur, used
}

// fillWeighted writes into *d the Decision at now on n units of what
// decideWeighted returned (in place: see limiterkit.Fill).
func (c *config) fillWeighted(d *throttle.Decision, now, n int64, ok bool, start, prev, cur, used int64) {
	if !ok {
		retry, reset := window.WeightedRetry(c.limit, c.window, prev, cur, n)
		limiterkit.Fill(d, false, c.limit, max(c.limit-used, 0), start+retry-now, start+reset-now)
		return
	}
	limiterkit.Fill(d, true, c.limit, max(c.limit-used-n, 0), 0, start+2*c.window-now)
}

// StepDecision is stepWeighted filling the Decision, for Algorithm.
func (c *config) StepDecision(d *throttle.Decision, old, now, n int64) int64 {
	next, ok, start, prev, cur, used := c.stepWeighted(old, now, n)
	c.fillWeighted(d, now, n, ok, start, prev, cur, used)
	return next
}

// fullWeighted reports whether the live weighted word w holds no units at
// now.
func (c *config) fullWeighted(w, now int64) bool {
	idx, _ := c.div.FloorDiv(now)
	d := c.lay.Since(w, idx)
	return c.lay.Lo(w) == 0 && (d > 0 || c.lay.Hi(w) == 0) || d >= 2 || d < -c.skew
}

// count returns the units of slot m recorded in ring (nil means empty).
func (c *config) count(ring []atomic.Int64, m int64) int64 {
	if ring == nil {
		return 0
	}
	e := ring[window.FloorMod(m, c.slots)].Load()
	if v := c.rlay.Lo(e); v > 0 && c.rlay.Since(e, m) == 0 {
		return v
	}
	return 0
}

// publish records v units for slot m in ring, unless the entry already
// holds a newer slot or at least as many units for m (a stale writer).
func (c *config) publish(ring []atomic.Int64, m, v int64) {
	e := &ring[window.FloorMod(m, c.slots)]
	for {
		old := e.Load()
		if u := c.rlay.Lo(old); u > 0 {
			if d := c.rlay.Since(old, m); d < 0 || d == 0 && u >= v {
				return
			}
		}
		if e.CompareAndSwap(old, c.rlay.Pack1(m, v)) {
			return
		}
	}
}

// ringOf returns the ring behind p, allocating it on first use.
func (c *config) ringOf(p *atomic.Pointer[[]atomic.Int64]) []atomic.Int64 {
	if r := p.Load(); r != nil {
		return *r
	}
	r := make([]atomic.Int64, c.slots)
	if p.CompareAndSwap(nil, &r) {
		return r
	}
	return *p.Load()
}

// decideSlotted admits or denies n units at now on the slotted state, and
// fills d: the word w packs the current slot, the total of the window and
// the current slot's count; ring holds the counts of earlier slots. It
// reports false if the state is dead.
func (c *config) decideSlotted(d *throttle.Decision, w *atomic.Int64, ring *atomic.Pointer[[]atomic.Int64], now, n int64) bool {
	j, _ := c.div.FloorDiv(now)
	k := c.slots
	for {
		old := w.Load()
		if old == window.Dead {
			return false
		}
		total, cur, at := c.lay.Hi(old), c.lay.Lo(old), j
		var from, left int64 // when moving on: the slot left, and its count
		switch d := c.lay.Since(old, j); {
		case d == 0:
		case d < 0 && d >= -c.skew && total > 0:
			at -= d // a later slot, reached by a caller with a later clock reading
		case d > 0 && d < k:
			// Sum the window anew from the ring (final for every slot before
			// from) rather than subtract the slots that left: the same in
			// exact operation, and a stale total cannot outlive a window.
			from, left = j-d, cur
			var r []atomic.Int64
			if p := ring.Load(); p != nil {
				r = *p
			}
			total, cur = left, 0
			for m := j - k + 1; m < from; m++ {
				total += c.count(r, m)
			}
		default:
			total, cur = 0, 0
		}
		if total+n > c.limit {
			c.denySlotted(d, ring, now, at, total, cur, from, left, n)
			return true
		}
		if left > 0 {
			c.publish(c.ringOf(ring), from, left)
		}
		if w.CompareAndSwap(old, c.lay.Pack2(at, total+n, cur+n)) {
			limiterkit.Fill(d, true, c.limit, max(c.limit-total-n, 0), 0, (at+k)*c.slot-now)
			return true
		}
	}
}

// denySlotted fills d with the denial of n units at slot at, where the
// window holds total units, cur of them in slot at; when the state was
// found in an earlier slot from, left is that slot's count (and cur is 0).
// RetryAfter is when enough of the oldest slots have left the window.
func (c *config) denySlotted(d *throttle.Decision, ring *atomic.Pointer[[]atomic.Int64], now, at, total, cur, from, left, n int64) {
	var r []atomic.Int64
	if p := ring.Load(); p != nil {
		r = *p
	}
	k, need := c.slots, total+n-c.limit
	units := func(m int64) int64 {
		switch {
		case m == at && cur > 0:
			return cur
		case left > 0 && m >= from:
			if m == from {
				return left
			}
			return 0
		}
		return c.count(r, m)
	}
	// last is the newest slot with units: at, from, or (only for a state
	// that was never written) found by a scan.
	last := at
	switch {
	case cur > 0:
	case left > 0:
		last = from
	default:
		for last = at; last > at-k && units(last) == 0; last-- {
		}
	}
	// The request fits once enough of the oldest slots have left. If the
	// slots before last cannot free enough, that is when last leaves, with
	// no need to read the ring.
	retry := last + k
	if total-units(last) >= need {
		for m, freed := at-k+1, int64(0); m < last; m++ {
			if freed += units(m); freed >= need {
				retry = m + k
				break
			}
		}
	}
	limiterkit.Fill(d, false, c.limit, max(c.limit-total, 0), retry*c.slot-now, max((last+k)*c.slot-now, 0))
}

// fullSlotted reports whether the live slotted word w holds no units at
// now: its slot has left the window (each move to a slot admits units).
func (c *config) fullSlotted(w, now int64) bool {
	j, _ := c.div.FloorDiv(now)
	d := c.lay.Since(w, j)
	return c.lay.Hi(w) == 0 || d >= c.slots || d < -c.skew
}

const cacheLine = 64

// Window is a sliding-window limiter guarding one resource, in the
// weighted or the slotted form. It is safe for concurrent use by multiple
// goroutines. The zero value is not usable: its methods fail with an error
// wrapping throttle.ErrInvalid; create it with NewWindow or
// NewSlottedWindow.
type Window struct {
	c    *config
	clk  clock.Source
	ring atomic.Pointer[[]atomic.Int64] // slotted form only
	_    [cacheLine - 32]byte
	w    atomic.Int64 // alone on its cache line: CAS traffic does not slow reads of c
	_    [cacheLine - 8]byte
}

// NewWindow returns a weighted sliding-window limiter admitting up to
// limit units in any window, estimated from two aligned windows (see the
// package documentation for the exact bounds). The only Option it reads is
// WithClock. Errors wrap throttle.ErrInvalid: limit outside [1, MaxLimit],
// window outside (0, 366 days], or a bad Option.
func NewWindow(limit int, window time.Duration, opts ...throttle.Option) (*Window, error) {
	return newWindow(limit, window, 0, opts)
}

// NewSlottedWindow returns a slotted sliding-window limiter: the window is
// split into slots slots, and a request is admitted when the units of the
// last slots slots plus its own are at most limit. Errors wrap
// throttle.ErrInvalid: as NewWindow, or slots outside [1, 65536], or a
// window that is not a whole number of nanoseconds per slot.
func NewSlottedWindow(limit int, window time.Duration, slots int, opts ...throttle.Option) (*Window, error) {
	if slots <= 0 {
		return nil, fmt.Errorf("%w: slidingwindow: %d slots out of range [1, %d]", throttle.ErrInvalid, slots, maxSlots)
	}
	return newWindow(limit, window, slots, opts)
}

func newWindow(limit int, w time.Duration, slots int, opts []throttle.Option) (*Window, error) {
	s, err := limiterkit.NewSingleSettings(opts...)
	if err != nil {
		return nil, err
	}
	c, err := newConfig(limit, w, slots)
	if err != nil {
		return nil, err
	}
	win := &Window{c: c, clk: clock.New(s.Clock)}
	if slots > 0 {
		c.ringOf(&win.ring)
	}
	return win, nil
}

// AllowN admits n units if the window has room for them now. When denied,
// RetryAfter is the exact time until it has (if nothing else is admitted
// meanwhile); ResetAfter is the time until the window is empty. Errors:
// n <= 0 wraps ErrInvalid, n > limit wraps ErrExceedsLimit.
func (w *Window) AllowN(n int) (d throttle.Decision, err error) {
	err = w.allow(&d, n)
	return d, err
}

// Allow is AllowN(n); it ignores ctx and key.
func (w *Window) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = w.allow(&d, n)
	return d, err
}

// allow is AllowN filling d (see limiterkit.Fill).
func (w *Window) allow(d *throttle.Decision, n int) error {
	c := w.c
	if c == nil {
		return errZero
	}
	if err := c.CheckN(n); err != nil {
		return err
	}
	now := w.clk.Now()
	if c.slots == 0 {
		ok, start, prev, cur, used, _ := c.decideWeighted(&w.w, now, int64(n))
		c.fillWeighted(d, now, int64(n), ok, start, prev, cur, used)
		return nil
	}
	c.decideSlotted(d, &w.w, &w.ring, now, int64(n))
	return nil
}

// Limit returns the limit (0 on a zero Window).
func (w *Window) Limit() int { return int(window.ParamsOf(w.c).Limit) }

// Quota reports the limit per window (zero on a zero Window).
func (w *Window) Quota() throttle.Quota { return window.ParamsOf(w.c).Quota() }

// weighted is the per-key state of a weighted Limiter. The zero value is a
// fresh key.
type weighted struct {
	w   atomic.Int64
	cfg atomic.Pointer[config] // set before the word first leaves zero
}

// Retire implements keyed.Retirer: it marks the state dead if it holds no
// units at now, or unconditionally when force is set.
func (s *weighted) Retire(j keyed.Judge, force bool) bool {
	return window.Retire(&s.w, j, force, s.full)
}

// Move implements keyed.State: it marks the state dead and copies it into
// dst.
func (s *weighted) Move(dst *weighted) { window.Move(&s.w, &s.cfg, &dst.w, &dst.cfg) }

// full loads the configuration after the word (set before the word first
// left zero) and asks it.
func (s *weighted) full(w, now int64) bool { return s.cfg.Load().fullWeighted(w, now) }

// slotted is the per-key state of a slotted Limiter. The zero value is a
// fresh key; its ring is allocated when the key first moves to a new slot.
type slotted struct {
	w    atomic.Int64
	cfg  atomic.Pointer[config]
	ring atomic.Pointer[[]atomic.Int64]
}

// Retire implements keyed.Retirer, as weighted.Retire.
func (s *slotted) Retire(j keyed.Judge, force bool) bool {
	return window.Retire(&s.w, j, force, s.full)
}

// Move implements keyed.State, as weighted.Move; the ring moves with the
// word. A decision on the old state may still record in the ring the
// count of the slot its word had ended: the moved word holds the same
// count, so the entry agrees with it.
func (s *slotted) Move(dst *slotted) {
	window.Move(&s.w, &s.cfg, &dst.w, &dst.cfg)
	dst.ring.Store(s.ring.Load()) // a ring a stale decision gives s later records only what the moved word holds
}

// full is weighted.full for the slotted form.
func (s *slotted) full(w, now int64) bool { return s.cfg.Load().fullSlotted(w, now) }

// Limiter is a set of sliding windows, one per key, all in the same form
// with the same limit and window. A key seen for the first time starts
// empty; a key whose window is empty again is forgotten (no accuracy is
// lost), and past throttle.WithMaxKeys a key not used recently (CLOCK) is
// evicted, leaving its counts as a debt that it (or a key sharing its cell
// of the debt table) starts from, so eviction never readmits. A key takes
// about 53 bytes in the weighted form, 70 slotted (plus its ring): its
// state and two hashes of the key (the key itself is not kept) in a table
// slot. All methods are safe for concurrent use. The zero value is not
// usable: its methods fail with an error wrapping throttle.ErrInvalid;
// create it with New or NewSlotted.
type Limiter struct {
	limits                                 // replaced by SetLimit
	wm     *keyed.Map[weighted, *weighted] // weighted form
	sm     *keyed.Map[slotted, *slotted]   // slotted form
}

// New returns a keyed weighted sliding-window limiter: each key may use up
// to limit units in any window, as estimated by NewWindow. Errors wrap
// throttle.ErrInvalid (see NewWindow). If the options start a sweeper
// (WithSweepInterval), Close stops it.
func New(limit int, window time.Duration, opts ...throttle.Option) (*Limiter, error) {
	return newLimiter(limit, window, 0, opts)
}

// NewSlotted returns a keyed slotted sliding-window limiter; see
// NewSlottedWindow. Each key's ring of slots is allocated on the key's
// first move to a new slot (8 bytes per slot).
func NewSlotted(limit int, window time.Duration, slots int, opts ...throttle.Option) (*Limiter, error) {
	if slots <= 0 {
		return nil, fmt.Errorf("%w: slidingwindow: %d slots out of range [1, %d]", throttle.ErrInvalid, slots, maxSlots)
	}
	return newLimiter(limit, window, slots, opts)
}

func newLimiter(limit int, w time.Duration, slots int, opts []throttle.Option) (*Limiter, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	c, err := newConfig(limit, w, slots)
	if err != nil {
		return nil, err
	}
	l := &Limiter{}
	window.Store(&l.limits, c)
	if slots == 0 {
		l.wm = keyed.New[weighted](s)
		l.wm.SetDebts(weightedDebts{c})
	} else {
		l.sm = keyed.New[slotted](s)
		l.sm.SetDebts(slottedDebts{c})
	}
	return l, nil
}

// Allow admits n units for key if its window has room for them now; see
// Window.AllowN for the Decision. It ignores ctx. Errors wrap ErrInvalid
// (bad key or n), ErrExceedsLimit (n > limit) or ErrClosed.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	c := window.Load(&l.limits)
	if c == nil {
		return d, errZero
	}
	if l.wm != nil {
		err = l.wm.Decide(key, n, int(c.limit), func(s *weighted, now int64) (bool, error) {
			if s.cfg.Load() == nil {
				s.cfg.Store(c)
			}
			ok, start, prev, cur, used, live := c.decideWeighted(&s.w, now, int64(n))
			if live {
				c.fillWeighted(&d, now, int64(n), ok, start, prev, cur, used)
			}
			return live, nil
		})
		return d, err
	}
	err = l.sm.Decide(key, n, int(c.limit), func(s *slotted, now int64) (bool, error) {
		if s.cfg.Load() == nil {
			s.cfg.Store(c)
		}
		return c.decideSlotted(&d, &s.w, &s.ring, now, int64(n)), nil
	})
	return d, err
}

// Len returns the number of keys tracked.
func (l *Limiter) Len() int {
	switch {
	case l.wm != nil:
		return l.wm.Len()
	case l.sm != nil:
		return l.sm.Len()
	}
	return 0
}

// Close stops the background sweeper, if any; later calls to Allow fail
// with ErrClosed. Close is idempotent and returns nil.
func (l *Limiter) Close() error {
	switch {
	case l.wm != nil:
		return l.wm.Close()
	case l.sm != nil:
		return l.sm.Close()
	}
	return nil
}
