package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/report"
	"github.com/throttlekit/throttle/internal/unsent"
)

// Outcome is how a request ended, as the caller reports it on release.
type Outcome uint8

// Outcomes.
const (
	// Success: the backend answered; the RTT is a sample.
	Success Outcome = iota
	// Dropped: the request timed out or was refused for overload (a 429,
	// a 503, RESOURCE_EXHAUSTED): a loss, which makes the limit back off.
	Dropped
	// Ignored: the request says nothing about the backend (the client
	// gave up, the request was malformed); it is not a sample.
	Ignored
)

// OutcomeOf classifies an error returned by a call: nil is Success; an
// error of a call that never reached the backend (NotSent: a limiter's
// refusal, ErrNotSent) or a cancelled context is Ignored; a deadline, or
// an error wrapping throttle.ErrUnavailable, is Dropped; any other error
// is Success (the backend answered, with an error).
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return Success
	case NotSent(err), errors.Is(err, context.Canceled):
		return Ignored
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, throttle.ErrUnavailable):
		return Dropped
	}
	return Success
}

// ErrNotSent is wrapped by the errors of requests that never left the
// client although a layer in front of them had let them through: a
// limiter behind it refused them (httplimit.Transport, the grpclimit
// client interceptors), or the caller gave up waiting for its turn. A
// Throttler counts such a request neither as a request nor as a
// rejection, a Limiter's Outcome for it is Ignored, and a retry.Policy
// does not charge it to its Budget.
var ErrNotSent = unsent.Err

// NotSent reports whether err is the error of a request that never
// reached the backend: it wraps ErrNotSent, or throttle.ErrLimited (a
// limiter's refusal: the call was not run).
func NotSent(err error) bool { return unsent.Is(err) }

// Window is what a Limiter measured over one window of samples, the
// input of an Algorithm.
type Window struct {
	// Samples counts the requests released with Success.
	Samples int
	// Dropped counts the requests released with Dropped, and successes
	// slower than Config.Timeout.
	Dropped int
	// AvgRTT and MinRTT are over the successes; 0 when there were none.
	AvgRTT, MinRTT time.Duration
	// MaxInFlight is the most units seen in flight at a release: a limit
	// far above it is not being tested by the load.
	MaxInFlight int
}

// Algorithm computes a new concurrency limit from the current one and a
// window of samples. A Limiter calls Update from one goroutine at a time
// (never concurrently), each call seeing the previous one's writes; an
// Algorithm may keep state, so give every Limiter its own. The Limiter
// clamps the result to [Config.Min, Config.Max].
type Algorithm interface {
	Update(limit float64, w Window) float64
}

// Config bounds and paces a Limiter. The zero value is the defaults.
type Config struct {
	// Initial is the limit before the first window (default 20), Min and
	// Max bound it (defaults 1 and 1000; at most maxLimit).
	Initial, Min, Max int
	// Window is the shortest time a window of samples spans (default
	// 100ms); WindowSamples is the fewest samples (successes or drops)
	// it holds (default 10). A window closes at the first release that
	// meets both.
	Window        time.Duration
	WindowSamples int
	// Timeout, when positive, counts a success slower than it as Dropped.
	Timeout time.Duration
	// Name and Observer, when Observer is set, report to it under Name
	// every call as throttle.Observe does (an EventDecision, or an
	// EventError, and an EventRelease when units held by TryHold or Hold
	// are given back) and each change of the limit as an EventLimit.
	Name     string
	Observer throttle.Observer
}

// maxLimit is the largest limit a Limiter accepts: the limit and the units
// in flight share one 64-bit word.
const maxLimit = 1<<31 - 1

// Layout of Limiter.word.
const (
	inMask     = 1<<32 - 1 // units in flight
	limitShift = 32        // the published limit, above
)

const busy = math.MinInt64 // Limiter.start while a window is being closed

// Limiter is a concurrency limit adapted by an Algorithm from the outcome
// and latency of the requests it admits. It guards one resource (a
// downstream, a handler) and ignores keys. It is safe for concurrent use by
// multiple goroutines. The zero value is not usable; create one with New.
//
// Units taken with Allow are given back with Release, which reports the
// request's RTT and Outcome. TryHold and Hold return a release func that
// measures the RTT itself on the Limiter's clock and reports Success,
// Dropped when the context's deadline expired, or Ignored when it was
// cancelled.
type Limiter struct {
	word atomic.Uint64 // limit<<limitShift | units in flight

	// The open window: successes (count<<40 | RTT sum in µs), drops, the
	// least RTT in ns and the most units in flight.
	acc    atomic.Uint64
	drops  atomic.Int64
	minRTT atomic.Int64
	maxIn  atomic.Int64
	start  atomic.Int64 // when the window opened, or busy

	limit float64 // the unrounded limit: only the closer of a window uses it
	alg   Algorithm
	cfg   Config
	rep   report.To // of cfg's Observer
	key   string    // the key of a Keyed limiter, for its events
	clock clock.Source

	waiters atomic.Int64 // goroutines in Hold's wait
	mu      sync.Mutex
	wake    chan struct{} // closed when units may have come free
}

const (
	sumBits = 40
	sumMask = 1<<sumBits - 1
)

// New returns a Limiter whose limit alg adapts within c's bounds. Of opts
// only throttle.WithClock applies. Errors wrap throttle.ErrInvalid.
func New(alg Algorithm, c Config, opts ...throttle.Option) (*Limiter, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	if alg == nil {
		return nil, fmt.Errorf("%w: adaptive: nil Algorithm", throttle.ErrInvalid)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Min, 1)
	def(&c.Max, 1000)
	def(&c.Initial, min(max(20, c.Min), c.Max))
	def(&c.WindowSamples, 10)
	if c.Window == 0 {
		c.Window = 100 * time.Millisecond
	}
	if c.Min < 1 || c.Max > maxLimit || c.Min > c.Max || c.Initial < c.Min || c.Initial > c.Max ||
		c.Window < 0 || c.WindowSamples < 1 || c.Timeout < 0 {
		return nil, fmt.Errorf("%w: adaptive: Config %+v: want 1 <= Min <= Initial <= Max <= %d, Window, WindowSamples, Timeout positive",
			throttle.ErrInvalid, c, maxLimit)
	}
	l := &Limiter{alg: alg, cfg: c, clock: clock.New(s.Clock), limit: float64(c.Initial), wake: make(chan struct{}),
		rep: report.New(c.Name, c.Observer)}
	l.word.Store(uint64(c.Initial) << limitShift)
	l.minRTT.Store(math.MaxInt64)
	l.start.Store(l.clock.Now())
	return l, nil
}

// Limit returns the current limit.
func (l *Limiter) Limit() int { return int(l.word.Load() >> limitShift) }

// InFlight returns the units in flight.
func (l *Limiter) InFlight() int { return int(l.word.Load() & inMask) }

// Quota reports the current limit with a zero Window: units come back by
// release.
func (l *Limiter) Quota() throttle.Quota { return throttle.Quota{Limit: l.Limit()} }

// Allow takes n units if they fit under the current limit; give them back
// with Release. n above the current limit but within Config.Max is
// denied, as the limit may grow. The key is ignored and ctx is not waited
// on. Errors wrap throttle.ErrInvalid (n <= 0) or throttle.ErrExceedsLimit
// (n above Config.Max).
func (l *Limiter) Allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	if l.rep.On() {
		return l.rep.Decide(ctx, limiterkit.MethodAllow, key, n, l.allow)
	}
	return d, l.fill(&d, n) // d filled in place: see limiterkit.Fill
}

// allow is Allow without the report.
func (l *Limiter) allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	return d, l.fill(&d, n)
}

// fill takes n units if they fit and fills d.
func (l *Limiter) fill(d *throttle.Decision, n int) error {
	if n <= 0 || n > l.cfg.Max {
		return limiterkit.CheckN(n, l.cfg.Max)
	}
	l.try(d, uint64(n))
	return nil
}

// try takes n units if they fit and fills d.
func (l *Limiter) try(d *throttle.Decision, n uint64) {
	for {
		w := l.word.Load()
		lim, cur := w>>limitShift, w&inMask
		if cur+n > lim {
			limiterkit.Fill(d, false, int64(lim), int64(lim-min(cur, lim)), 0, 0)
			return
		}
		if l.word.CompareAndSwap(w, w+n) {
			limiterkit.Fill(d, true, int64(lim), int64(lim-cur-n), 0, 0)
			return
		}
	}
}

// Release gives back n units taken with Allow and reports how the request
// went: its round-trip time and Outcome. Releasing more than is in flight
// returns an error wrapping throttle.ErrInvalid and releases nothing.
func (l *Limiter) Release(n int, rtt time.Duration, o Outcome) error {
	due, err := l.release(n, int64(rtt), o)
	if due {
		l.closeIfDue(l.clock.Now())
	}
	return err
}

// release gives back n units and adds the request to the open window. It
// reports whether the window has enough samples that it may be due to
// close: then the caller reads the clock and calls closeIfDue.
func (l *Limiter) release(n int, rtt int64, o Outcome) (due bool, err error) {
	var cur uint64
	for {
		w := l.word.Load()
		cur = w & inMask
		if n <= 0 || uint64(n) > cur {
			return false, fmt.Errorf("%w: adaptive: release of %d units, %d in flight", throttle.ErrInvalid, n, cur)
		}
		if l.word.CompareAndSwap(w, w-uint64(n)) {
			break
		}
	}
	if l.waiters.Load() > 0 {
		l.signal()
	}
	return l.sample(rtt, int64(cur), o), nil
}

// Past twice WindowSamples, only every lateSmall-th sample of a window
// may close it, and past lateFrom samples every lateLarge-th: the clock is
// read that much less often. Windows of under lateFrom samples (under
// 10,240 requests a second with the default Window) close as before.
const (
	lateSmall = 8
	lateFrom  = 1024
	lateLarge = 64
)

// sample adds one request to the open window and reports whether the
// window holds enough samples to close. Past twice WindowSamples, only
// every 8th sample says so, and past 1024 samples every 64th: a busy
// window closes at most 8 samples late, or 64 of more than 1024.
func (l *Limiter) sample(rtt, inFlight int64, o Outcome) (due bool) {
	if o == Success && l.cfg.Timeout > 0 && rtt > int64(l.cfg.Timeout) {
		o = Dropped
	}
	var mine, total int64
	switch o {
	case Success:
		rtt = max(rtt, 0)
		mine = int64(l.acc.Add(1<<sumBits|uint64(min(rtt/1000, sumMask>>8))) >> sumBits)
		total = mine + l.drops.Load()
		for m := l.minRTT.Load(); rtt < m && !l.minRTT.CompareAndSwap(m, rtt); m = l.minRTT.Load() {
		}
	case Dropped:
		mine = l.drops.Add(1)
		total = mine + int64(l.acc.Load()>>sumBits)
	default:
		return false
	}
	for m := l.maxIn.Load(); inFlight > m && !l.maxIn.CompareAndSwap(m, inFlight); m = l.maxIn.Load() {
	}
	ws := int64(l.cfg.WindowSamples)
	switch {
	case total < ws:
		return false
	case total < 2*ws:
		return true
	case total < lateFrom:
		return mine%lateSmall == 0
	}
	return mine%lateLarge == 0
}

// closeIfDue closes the open window if it is at least Config.Window old,
// or opened in the future of a clock that stepped back, and nobody else is
// closing it.
func (l *Limiter) closeIfDue(now int64) {
	start := l.start.Load()
	if age := now - start; start == busy || age >= 0 && age < int64(l.cfg.Window) || !l.start.CompareAndSwap(start, busy) {
		return
	}
	l.close(now)
}

// close runs the Algorithm on the window and publishes the new limit. Only
// the caller that swapped start to busy runs it; storing start again
// hands the next window to whoever closes it, with this one's writes.
func (l *Limiter) close(now int64) {
	acc := l.acc.Swap(0)
	w := Window{
		Samples:     int(acc >> sumBits),
		Dropped:     int(l.drops.Swap(0)),
		MaxInFlight: int(l.maxIn.Swap(0)),
	}
	if w.Samples > 0 {
		w.AvgRTT = time.Duration(acc&sumMask) * time.Microsecond / time.Duration(w.Samples)
		w.MinRTT = time.Duration(l.minRTT.Swap(math.MaxInt64))
	}
	next := l.alg.Update(l.limit, w)
	if next != next { // NaN: keep the limit
		next = l.limit
	}
	l.limit = min(max(next, float64(l.cfg.Min)), float64(l.cfg.Max))
	lim := uint64(l.limit)
	var old uint64
	for {
		v := l.word.Load()
		if old = v >> limitShift; old == lim || l.word.CompareAndSwap(v, lim<<limitShift|v&inMask) {
			break
		}
	}
	l.start.Store(now)
	if lim > old && l.waiters.Load() > 0 {
		l.signal()
	}
	if l.rep.On() && lim != old {
		cur := int(l.word.Load() & inMask)
		l.rep.Event(throttle.Event{Kind: throttle.EventLimit, Key: l.key, N: cur,
			Decision: throttle.Decision{Allowed: true, Limit: int(lim), Remaining: max(int(lim)-cur, 0)}, Latency: w.AvgRTT})
	}
}

// signal wakes the goroutines waiting in Hold.
func (l *Limiter) signal() {
	l.mu.Lock()
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// TryHold is Allow with the units' release attached: when the Decision is
// Allowed, release gives them back (only its first call counts) and
// reports the time since TryHold as the RTT, with the Outcome the
// context's state implies: Dropped past its deadline, Ignored when it was
// cancelled, Success otherwise. When denied, release does nothing.
func (l *Limiter) TryHold(ctx context.Context, key string, n int) (d throttle.Decision, release func(), err error) {
	start := l.rep.Start()
	err = l.fill(&d, n)
	if l.rep.On() {
		l.rep.Call(limiterkit.MethodTryHold, key, n, d, err, start)
	}
	if err != nil || !d.Allowed {
		return d, noRelease, err
	}
	return d, l.rep.Held(l.releaser(ctx, n), limiterkit.MethodTryHold, key, n), nil
}

// Hold waits until n units fit or ctx is done, and returns their release
// (see TryHold). Waiters are woken together when units come free or the
// limit rises, and race for them: there is no queue order. Errors wrap
// ctx.Err(), throttle.ErrInvalid or throttle.ErrExceedsLimit.
func (l *Limiter) Hold(ctx context.Context, key string, n int) (func(), error) {
	if !l.rep.On() {
		return l.hold(ctx, n)
	}
	start := l.rep.Start()
	release, err := l.hold(ctx, n)
	l.rep.Call(limiterkit.MethodHold, key, n, throttle.Decision{Allowed: err == nil}, err, start)
	if err != nil {
		return nil, err
	}
	return l.rep.Held(release, limiterkit.MethodHold, key, n), nil
}

func (l *Limiter) hold(ctx context.Context, n int) (func(), error) {
	if err := limiterkit.CheckN(n, l.cfg.Max); err != nil {
		return nil, err
	}
	var d throttle.Decision
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if l.try(&d, uint64(n)); d.Allowed {
			return l.releaser(ctx, n), nil
		}
		// Register, then look again: a release after the look sees the
		// waiter and wakes the channel taken before it.
		l.waiters.Add(1)
		l.mu.Lock()
		ch := l.wake
		l.mu.Unlock()
		if l.try(&d, uint64(n)); d.Allowed {
			l.waiters.Add(-1)
			return l.releaser(ctx, n), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
		}
		l.waiters.Add(-1)
	}
}

func (l *Limiter) releaser(ctx context.Context, n int) func() {
	start := l.clock.Now()
	var done atomic.Bool
	return func() {
		if !done.CompareAndSwap(false, true) {
			return
		}
		o := Success
		switch ctx.Err() {
		case context.DeadlineExceeded:
			o = Dropped
		case context.Canceled:
			o = Ignored
		}
		now := l.clock.Now()
		if due, _ := l.release(n, now-start, o); due { // cannot fail: these n units are held
			l.closeIfDue(now)
		}
	}
}

func noRelease() {}
