// Package fixedwindow is a fixed-window counter rate limiter: time is cut
// into windows of a fixed length, each window admits up to limit units,
// and the count starts again at zero when the next window opens.
//
//	l, err := fixedwindow.New(100, time.Minute) // per key: 100 a minute, counted per clock minute
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	d, err := l.Allow(ctx, userID, 1)
//
// Two placements of the windows are offered. New and NewWindow align them
// to the clock (multiples of the window length since the Unix epoch), so
// every key resets at the same instant. NewAnchored and NewAnchoredWindow
// open a window at the first hit when none is open, as a counter with a
// time-to-live does: each key then resets on its own schedule.
//
// The whole state of a window is one int64 — the window's index (aligned)
// or opening instant (anchored) packed with the count — updated by one
// compare-and-swap: no mutex, no reset goroutine, no allocation, one clock
// read per decision.
//
// # Guarantees
//
// Each window admits at most limit units, and a fresh or reset window
// admits exactly limit units at one instant. Consequently any interval of
// length d admits at most limit·(⌈d/window⌉+1) units.
//
// The known weakness of the algorithm: an interval of one window length
// that straddles a boundary may hold up to 2·limit units — limit just
// before the boundary and limit just after. With New(100, time.Minute),
// 200 requests can pass within two nanoseconds across a minute boundary.
// Use package slidingwindow or tokenbucket when that matters.
//
// Decisions are exact to the nanosecond: a denied request retried
// RetryAfter later (when the window has closed) succeeds, and retried 1 ns
// sooner fails. ResetAfter is the time until the window closes.
//
// An anchored window lasts exactly the window length when limit and window
// are not both large; the opening instant is kept in ticks of 2^s ns,
// rounded up, with s = max(0, bitlen(window ns) + bitlen(limit) - 52):
// s is 0 up to a 73-minute window for limits below 1024, or a 4.2-second
// window for limits below 2^20. A window that opens on a tick boundary
// lasts exactly window; otherwise up to 2^s - 1 ns longer, never shorter.
//
// # Limits and clock
//
// limit may be up to 2^32-1 and window up to 366 days. The window index
// (or opening tick) is kept modulo 2^(63-bitlen(limit)): 2^56 windows for
// a limit of 100, 2^31 at the largest limit. A Window left untouched for about a
// multiple of that many windows may take its old count for current for at
// most max(2 windows, 1 s): it can only deny more, never admit more.
//
// A request whose clock reading is older than the window another
// goroutine already opened is counted in that newer window (RetryAfter is
// then measured to its end, so it may exceed the window length): this is
// what keeps the bounds when goroutines read the clock in one order and
// update the state in another. The bounds hold for a clock that never
// steps back by more than max(2 windows, 1 s) (the default clock is
// monotonic); a state found further ahead than that is taken as stale and
// restarts empty.
package fixedwindow

import (
	"context"
	"fmt"
	"math/bits"
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
	// maxLimit is the largest limit per window.
	maxLimit = 1<<32 - 1
	// maxWindow is the longest window.
	maxWindow = bridge.MaxPeriod
)

// errZero is returned by the methods of a limiter not made by its
// constructor.
var errZero = fmt.Errorf("%w: zero fixedwindow limiter: use the constructor", throttle.ErrInvalid)

// config is the immutable configuration shared by every state of a
// limiter.
type config struct {
	limit    int64
	window   int64
	div      window.Divisor // by window
	lay      window.Layout
	anchored bool
	shift    uint  // anchored: the opening instant is kept in ticks of 1<<shift ns
	skew     int64 // see window.Layout.Skew: in windows (aligned) or ticks (anchored)
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

func newConfig(limit int, w time.Duration, anchored bool) (*config, error) {
	switch {
	case limit <= 0 || limit > maxLimit:
		return nil, fmt.Errorf("%w: fixedwindow: limit %d out of range [1, %d]", throttle.ErrInvalid, limit, maxLimit)
	case w <= 0 || w > maxWindow:
		return nil, fmt.Errorf("%w: fixedwindow: window %v out of range (0, %v]", throttle.ErrInvalid, w, maxWindow)
	}
	lay, ok := window.NewLayout(int64(limit), 1)
	if !ok {
		return nil, fmt.Errorf("%w: fixedwindow: limit %d too large", throttle.ErrInvalid, limit)
	}
	c := &config{limit: int64(limit), window: int64(w), div: window.NewDivisor(int64(w)), lay: lay, anchored: anchored}
	if anchored {
		// Keep the window within 2^(TagBits-11) ticks, so that an open
		// window is told from a stale one with a wide margin.
		if s := bits.Len64(uint64(w)) - int(lay.TagBits()-11); s > 0 {
			c.shift = uint(s)
		}
		c.skew = lay.Skew(1 << c.shift)
	} else {
		c.skew = lay.Skew(c.window)
	}
	return c, nil
}

// decide admits or denies n units at now on the state word w, and returns
// what the Decision is made of (see step). live is false if the state is
// dead (retired from a keyed map).
func (c *config) decide(w *atomic.Int64, now, n int64) (ok bool, count, end int64, live bool) {
	for {
		old := w.Load()
		if old == window.Dead {
			return false, 0, 0, false
		}
		next, ok, count, end := c.step(old, now, n)
		if !ok || w.CompareAndSwap(old, next) {
			return ok, count, end, true
		}
	}
}

// step is the decision as a pure function of the live state word old:
// whether n units are admitted, the word to store if so, the window's
// count once decided and the instant the window ends.
func (c *config) step(old, now, n int64) (next int64, ok bool, count, end int64) {
	if c.anchored {
		return c.stepAnchored(old, now, n)
	}
	idx, _ := c.div.FloorDiv(now)
	count, at := c.lay.Lo(old), idx
	switch d := c.lay.Since(old, idx); {
	case d == 0:
	case d < 0 && d >= -c.skew && count > 0:
		at -= d // a caller with a later clock reading opened a later window: count in it
		// (A word holding no units is empty whatever its window: the
		// fresh word's window 0 is ahead of every reading before 1970.)
	default:
		count = 0 // a new window
	}
	end = (at + 1) * c.window
	if count+n > c.limit {
		return old, false, count, end
	}
	return c.lay.Pack1(at, count+n), true, count + n, end
}

func (c *config) stepAnchored(old, now, n int64) (next int64, ok bool, count, end int64) {
	tick := now >> c.shift
	count = c.lay.Lo(old)
	open := tick - c.lay.Since(old, tick) // the stored opening tick
	if count == 0 || open-tick > c.skew || now-open<<c.shift >= c.window {
		// No open window: open one now, on the first tick at or after
		// now. (A window opened after now by a caller with a later
		// clock reading is open: the request counts in it.)
		count, open = 0, (now+1<<c.shift-1)>>c.shift
	}
	end = open<<c.shift + c.window
	if count+n > c.limit {
		return old, false, count, end
	}
	return c.lay.Pack1(open, count+n), true, count + n, end
}

// StepDecision is step filling the Decision, for Algorithm.
func (c *config) StepDecision(d *throttle.Decision, old, now, n int64) int64 {
	next, ok, count, end := c.step(old, now, n)
	c.fill(d, now, ok, count, end)
	return next
}

// fill writes into *d the Decision at now of what decide returned (in
// place: see window.Fill).
func (c *config) fill(d *throttle.Decision, now int64, ok bool, count, end int64) {
	retry := int64(0)
	if !ok {
		retry = end - now
	}
	limiterkit.Fill(d, ok, c.limit, max(c.limit-count, 0), retry, end-now) // count > limit after SetLimit lowered it
}

// full reports whether the live word w holds no units at now.
func (c *config) full(w, now int64) bool {
	count := c.lay.Lo(w)
	if count == 0 {
		return true
	}
	if !c.anchored {
		idx, _ := c.div.FloorDiv(now)
		d := c.lay.Since(w, idx)
		return d > 0 || d < -c.skew
	}
	tick := now >> c.shift
	open := tick - c.lay.Since(w, tick)
	return open-tick > c.skew || now-open<<c.shift >= c.window
}

// WithLimit returns a copy of c with another limit, in the same layout,
// so that the words c wrote keep their meaning.
func (c *config) WithLimit(limit int) (*config, error) {
	if limit <= 0 || int64(limit) > c.lay.Max() {
		return nil, fmt.Errorf("%w: fixedwindow: SetLimit(%d): want 1 to %d, what the counters sized at New hold", throttle.ErrInvalid, limit, c.lay.Max())
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

const cacheLine = 64

// Window is a fixed-window limiter guarding one resource. It is safe for
// concurrent use by multiple goroutines. The zero value is not usable: its
// methods fail with an error wrapping throttle.ErrInvalid; create it with
// NewWindow or NewAnchoredWindow.
type Window struct {
	c   *config
	clk clock.Source
	_   [cacheLine - 24]byte
	w   atomic.Int64 // alone on its cache line: CAS traffic does not slow reads of c
	_   [cacheLine - 8]byte
}

// NewWindow returns a limiter admitting up to limit units per window,
// windows aligned to the clock. The only Option it reads is WithClock.
// Errors wrap throttle.ErrInvalid: limit outside [1, 2^32-1], window
// outside (0, 366 days], or a bad Option.
func NewWindow(limit int, window time.Duration, opts ...throttle.Option) (*Window, error) {
	return newWindow(limit, window, false, opts)
}

// NewAnchoredWindow is NewWindow with windows opened by the first hit when
// none is open, instead of aligned to the clock.
func NewAnchoredWindow(limit int, window time.Duration, opts ...throttle.Option) (*Window, error) {
	return newWindow(limit, window, true, opts)
}

func newWindow(limit int, w time.Duration, anchored bool, opts []throttle.Option) (*Window, error) {
	s, err := limiterkit.NewSingleSettings(opts...)
	if err != nil {
		return nil, err
	}
	c, err := newConfig(limit, w, anchored)
	if err != nil {
		return nil, err
	}
	return &Window{c: c, clk: clock.New(s.Clock)}, nil
}

// AllowN admits n units if the current window has room for them. When
// denied, RetryAfter is the time until the window closes. Errors: n <= 0
// wraps ErrInvalid, n > limit wraps ErrExceedsLimit.
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
	ok, count, end, _ := c.decide(&w.w, now, int64(n))
	c.fill(d, now, ok, count, end)
	return nil
}

// Limit returns the limit per window (0 on a zero Window).
func (w *Window) Limit() int { return int(window.ParamsOf(w.c).Limit) }

// Quota reports the limit per window (zero on a zero Window).
func (w *Window) Quota() throttle.Quota { return window.ParamsOf(w.c).Quota() }

// state is the per-key state of a Limiter: the packed word, and the
// configuration, which Retire needs. The zero value is a fresh key.
type state struct {
	w   atomic.Int64
	cfg atomic.Pointer[config] // set before the word first leaves zero
}

// Retire marks the state dead if it holds no units at j.Now(), or
// unconditionally when force is set. It implements keyed.Retirer.
func (s *state) Retire(j keyed.Judge, force bool) bool {
	return window.Retire(&s.w, j, force, s.full)
}

// Evict marks the state dead and returns the word it held (0 if dead): its
// debt. It implements keyed.Debtor.
func (s *state) Evict() int64 { return window.Evict(&s.w) }

// Merge returns the later window (or opening) with the larger count: at
// least as strict as either debt. It implements keyed.Debts.
func (c *config) Merge(a, b int64) int64 {
	if c.lay.Since(a, c.lay.Tag(b)) > 0 {
		a, b = b, a
	}
	return c.lay.Pack1(c.lay.Tag(a), max(c.lay.Lo(a), c.lay.Lo(b)))
}

// Paid reports whether debt d holds no units at now.
func (c *config) Paid(d, now int64) bool { return c.full(d, now) }

// Owe makes the fresh state s start from debt d.
func (c *config) Owe(s *state, d int64) {
	s.cfg.Store(c)
	s.w.Store(d)
}

// Move marks the state dead and copies it into dst. It implements
// keyed.State.
func (s *state) Move(dst *state) { window.Move(&s.w, &s.cfg, &dst.w, &dst.cfg) }

// full loads the configuration after the word (set before the word first
// left zero) and asks it.
func (s *state) full(w, now int64) bool { return s.cfg.Load().full(w, now) }

// Limiter is a set of fixed-window counters, one per key, all with the
// same limit and window. A key seen for the first time starts empty; a key
// whose window has closed is forgotten (no accuracy is lost), and past
// throttle.WithMaxKeys a key not used recently (CLOCK) is evicted, leaving its
// count as a debt that it (or a key sharing its cell of the debt table)
// starts from, so eviction never readmits. A key takes about 53 bytes:
// its 16-byte state and two hashes of the key (the key itself is not
// kept) in a table slot. All methods are safe for concurrent use. The zero value is not usable: its methods
// fail with an error wrapping throttle.ErrInvalid; create it with New or
// NewAnchored.
type Limiter struct {
	limits // replaced by SetLimit
	m      *keyed.Map[state, *state]
}

// New returns a keyed limiter admitting up to limit units per window for
// each key, windows aligned to the clock: every key resets at the same
// instant. Errors wrap throttle.ErrInvalid (see NewWindow). If the options
// start a sweeper (WithSweepInterval), Close stops it.
func New(limit int, window time.Duration, opts ...throttle.Option) (*Limiter, error) {
	return newLimiter(limit, window, false, opts)
}

// NewAnchored is New with each key's window opened by its first hit when
// none is open, so keys reset at different instants.
func NewAnchored(limit int, window time.Duration, opts ...throttle.Option) (*Limiter, error) {
	return newLimiter(limit, window, true, opts)
}

func newLimiter(limit int, w time.Duration, anchored bool, opts []throttle.Option) (*Limiter, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	c, err := newConfig(limit, w, anchored)
	if err != nil {
		return nil, err
	}
	m := keyed.New[state](s)
	m.SetDebts(c)
	l := &Limiter{m: m}
	window.Store(&l.limits, c)
	return l, nil
}

// Allow admits n units for key if its current window has room for them;
// see Window.AllowN for the Decision. It ignores ctx. Errors wrap
// ErrInvalid (bad key or n), ErrExceedsLimit (n > limit) or ErrClosed.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	if l.m == nil {
		return d, errZero
	}
	c := window.Load(&l.limits)
	err = l.m.Decide(key, n, int(c.limit), func(s *state, now int64) (bool, error) {
		if s.cfg.Load() == nil {
			s.cfg.Store(c)
		}
		ok, count, end, live := c.decide(&s.w, now, int64(n))
		if live {
			c.fill(&d, now, ok, count, end)
		}
		return live, nil
	})
	return d, err
}

// Len returns the number of keys tracked.
func (l *Limiter) Len() int {
	if l.m == nil {
		return 0
	}
	return l.m.Len()
}

// Close stops the background sweeper, if any; later calls to Allow fail
// with ErrClosed. Close is idempotent and returns nil.
func (l *Limiter) Close() error {
	if l.m == nil {
		return nil
	}
	return l.m.Close()
}
