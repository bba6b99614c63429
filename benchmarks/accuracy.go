package benchmarks

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// Arrival is one request of a trace: n units for key number Key, At
// after the start.
type Arrival struct {
	At  time.Duration
	Key int
	N   int
	// Skew makes the limiter's clock read At-Skew for this call: a
	// goroutine that read the clock and was then preempted before it
	// decided. Only virtual-time runs apply it.
	Skew time.Duration
}

// Trace is a sequence of requests offered to a limiter of Limit units per
// Window. Traces are deterministic (seeded).
type Trace struct {
	Name     string
	Desc     string
	Limit    int
	Window   time.Duration
	Keys     int
	Weighted bool // some requests ask for n > 1
	Recovery bool // the trace saturates the limiter and then polls: measure the time to the first admission after the first denial
	Arrivals []Arrival
}

// Length returns the time of the last arrival.
func (t Trace) Length() time.Duration {
	if len(t.Arrivals) == 0 {
		return 0
	}
	return t.Arrivals[len(t.Arrivals)-1].At
}

// Traces returns the accuracy traces for a limit of limit units per
// window. Each lasts ten windows unless said otherwise.
func Traces(limit int, window time.Duration) []Trace {
	r := rand.New(rand.NewPCG(1, 2)) // drawn from by the traces in this order
	return []Trace{
		steadyTrace(limit, window),
		onOffTrace(limit, window),
		poissonTrace(limit, window, r),
		boundaryTrace(limit, window),
		keysTrace(limit, window, r),
		weightedTrace(limit, window, r),
		staleTrace(limit, window, r),
		recoveryTrace(limit, window),
	}
}

// steadyTrace is over the rate: twice the rate, evenly spaced.
func steadyTrace(L int, W time.Duration) Trace {
	t := Trace{Name: "steady 2×", Desc: "evenly spaced at twice the rate", Limit: L, Window: W, Keys: 1}
	gap := W / time.Duration(2*L)
	for at := time.Duration(0); at < 10*W; at += gap {
		t.Arrivals = append(t.Arrivals, Arrival{At: at, N: 1})
	}
	return t
}

// onOffTrace is bursty: 2·limit spread over half a window, then 1.5
// windows of silence.
func onOffTrace(L int, W time.Duration) Trace {
	t := Trace{Name: "on/off", Desc: "2×limit in half a window, then 1.5 windows idle", Limit: L, Window: W, Keys: 1}
	for start := time.Duration(0); start < 10*W; start += 2 * W {
		g := W / 2 / time.Duration(2*L)
		for i := range 2 * L {
			t.Arrivals = append(t.Arrivals, Arrival{At: start + time.Duration(i)*g, N: 1})
		}
	}
	return t
}

// poissonTrace is Poisson arrivals at 1.5 times the rate.
func poissonTrace(L int, W time.Duration, r *rand.Rand) Trace {
	t := Trace{Name: "Poisson 1.5×", Desc: "Poisson arrivals at 1.5 times the rate", Limit: L, Window: W, Keys: 1}
	mean := float64(W) / (1.5 * float64(L))
	for at := 0.0; at < float64(10*W); at += r.ExpFloat64() * mean {
		t.Arrivals = append(t.Arrivals, Arrival{At: time.Duration(at), N: 1})
	}
	return t
}

// boundaryTrace is the boundary attack: a probe at 0 (it starts windows
// that are anchored at the first request), then, around every other
// window edge, 2·limit requests packed within ±1% of a window: the window
// before the edge is untouched until then, so a fixed window admits limit
// just before the edge and limit just after.
func boundaryTrace(L int, W time.Duration) Trace {
	t := Trace{Name: "boundary", Desc: "probe at 0, then 2×limit within ±W/100 of every other window edge", Limit: L, Window: W, Keys: 1}
	t.Arrivals = append(t.Arrivals, Arrival{At: 0, N: 1})
	delta := W / 100
	for k := 1; k < 10; k += 2 {
		edge := time.Duration(k) * W
		g := 2 * delta / time.Duration(2*L)
		for i := range 2 * L {
			t.Arrivals = append(t.Arrivals, Arrival{At: edge - delta + time.Duration(i)*g, N: 1})
		}
	}
	return t
}

// keysTrace is many keys: 200 keys of a tenth of the limit, each at twice
// its rate with its own phase.
func keysTrace(L int, W time.Duration, r *rand.Rand) Trace {
	const keys = 200
	kl := max(L/10, 1)
	t := Trace{Name: "200 keys", Desc: "200 keys (limit/10 each), each at twice its rate", Limit: kl, Window: W, Keys: keys}
	kg := W / time.Duration(2*kl)
	for k := range keys {
		phase := time.Duration(r.Int64N(int64(kg)))
		for at := phase; at < 10*W; at += kg {
			t.Arrivals = append(t.Arrivals, Arrival{At: at, Key: k, N: 1})
		}
	}
	slices.SortStableFunc(t.Arrivals, func(a, b Arrival) int { return int(a.At - b.At) })
	return t
}

// weightedTrace asks for n uniform in [1, limit/5], twice the rate in
// units.
func weightedTrace(L int, W time.Duration, r *rand.Rand) Trace {
	t := Trace{Name: "weighted", Desc: "n uniform in [1, limit/5], twice the rate in units", Limit: L, Window: W, Keys: 1, Weighted: true}
	maxN := max(L/5, 1)
	wgap := time.Duration(float64(W) * (float64(maxN+1) / 2) / float64(2*L))
	for at := time.Duration(0); at < 10*W; at += wgap {
		t.Arrivals = append(t.Arrivals, Arrival{At: at, N: 1 + r.IntN(maxN)})
	}
	return t
}

// staleTrace has stale clock reads: four times the rate, and one call in
// five decides with a clock read up to a hundredth of a window old (10 ms
// for a 1 s window: the time slice after which Go's scheduler preempts a
// goroutine, which can happen between reading the clock and deciding).
func staleTrace(L int, W time.Duration, r *rand.Rand) Trace {
	t := Trace{Name: "stale reads", Desc: "4× the rate; 1 call in 5 uses a clock read up to W/100 old", Limit: L, Window: W, Keys: 1}
	sgap := W / time.Duration(4*L)
	for at := time.Duration(0); at < 10*W; at += sgap {
		a := Arrival{At: at, N: 1}
		if r.IntN(5) == 0 {
			a.Skew = min(at, time.Duration(r.Int64N(int64(W/100))))
		}
		t.Arrivals = append(t.Arrivals, a)
	}
	return t
}

// recoveryTrace is 2·limit at once, then a poll every W/1000 for three
// windows.
func recoveryTrace(L int, W time.Duration) Trace {
	t := Trace{Name: "burst+poll", Desc: "2×limit at once, then one request every W/1000 for 3 windows", Limit: L, Window: W, Keys: 1, Recovery: true}
	for range 2 * L {
		t.Arrivals = append(t.Arrivals, Arrival{At: 0, N: 1})
	}
	for at := W / 1000; at <= 3*W; at += W / 1000 {
		t.Arrivals = append(t.Arrivals, Arrival{At: at, N: 1})
	}
	return t
}

// Event is an admission seen by the harness.
type Event struct {
	At  time.Duration
	Key int
	N   int
}

// AccuracyResult is what one subject did on one trace.
type AccuracyResult struct {
	Subject  Subject
	Trace    string
	RealTime bool          // replayed on the wall clock (the subject takes no clock)
	Window   time.Duration // the window it ran with (shorter on the wall clock)
	Limit    int

	Offered  int64 // units asked for
	Admitted int64 // units admitted
	Ideal    int64 // units an exact token bucket (burst Limit, Limit per Window) admits on the same arrivals
	Errors   int64 // calls that returned an error (counted as denials)

	// MaxInWindow is the most units admitted for one key in any
	// half-open interval of one Window.
	MaxInWindow int64
	// Recovery is, on a recovery trace, the time from the first denial
	// to the next admission, in windows; -1 if it never recovered.
	Recovery float64
	// Timeline holds the admissions, At in windows×1e9 (so a window is
	// one second whatever the real window was).
	Timeline []Event
}

// Ratio returns Admitted/Ideal.
func (a AccuracyResult) Ratio() float64 {
	if a.Ideal == 0 {
		return math.NaN()
	}
	return float64(a.Admitted) / float64(a.Ideal)
}

// WindowRatio returns MaxInWindow/Limit.
func (a AccuracyResult) WindowRatio() float64 { return float64(a.MaxInWindow) / float64(a.Limit) }

// Runs reports whether s can run t: a weighted trace needs a weighted
// subject, a trace of many keys a keyed subject, and a subject with no
// denied path runs no trace.
func Runs(s Subject, t Trace) bool {
	return !s.Blocks && (!t.Weighted || s.Weighted) && (t.Keys <= 1 || s.Keyed)
}

// keyNames returns the key strings of a trace.
func keyNames(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}

// RunVirtual replays t on s with a virtual clock: exact and instant.
func RunVirtual(s Subject, t Trace) (AccuracyResult, error) {
	clk := throttletest.NewClock()
	l, err := s.Open(Config{Limit: t.Limit, Window: t.Window, Clock: clk})
	if err != nil {
		return AccuracyResult{}, err
	}
	defer closeLimiter(l)
	keys := keyNames(t.Keys)
	calls := make([]call, 0, len(t.Arrivals))
	for _, a := range t.Arrivals {
		clk.Set(throttletest.Epoch.Add(a.At - a.Skew))
		d, err := l.Allow(bg, keys[a.Key], a.N)
		calls = append(calls, call{at: a.At, key: a.Key, n: a.N, ok: d.Allowed && err == nil, err: err != nil})
	}
	return score(s, t, calls, t.Window, t.Window, false), nil
}

// RunReal replays t on s on the wall clock, with the trace's times scaled
// so that its window lasts window. Scores use the times at which the
// calls were actually made.
func RunReal(s Subject, t Trace, window time.Duration) (AccuracyResult, error) {
	l, err := s.Open(Config{Limit: t.Limit, Window: window})
	if err != nil {
		return AccuracyResult{}, err
	}
	defer closeLimiter(l)
	keys := keyNames(t.Keys)
	scale := float64(window) / float64(t.Window)
	calls := make([]call, 0, len(t.Arrivals))
	start := time.Now()
	for _, a := range t.Arrivals {
		target := time.Duration(float64(a.At) * scale)
		for {
			ahead := target - time.Since(start)
			if ahead <= 0 {
				break
			}
			if ahead > 2*time.Millisecond {
				time.Sleep(ahead - time.Millisecond)
			} else {
				runtime.Gosched()
			}
		}
		at := time.Since(start)
		d, err := l.Allow(bg, keys[a.Key], a.N)
		calls = append(calls, call{at: at, key: a.Key, n: a.N, ok: d.Allowed && err == nil, err: err != nil})
	}
	return score(s, t, calls, window, t.Window, true), nil
}

type call struct {
	at     time.Duration
	key, n int
	ok     bool
	err    bool
}

// score computes the metrics of calls made to a limiter of t.Limit per
// window; norm is the window the timeline is expressed in.
func score(s Subject, t Trace, calls []call, window, norm time.Duration, real bool) AccuracyResult {
	res := AccuracyResult{Subject: s, Trace: t.Name, RealTime: real, Window: window, Limit: t.Limit, Recovery: math.NaN()}
	ideal := make([]bucket, t.Keys)
	perKey := make([][]Event, t.Keys)
	firstDenial := time.Duration(-1)
	for _, c := range calls {
		res.Offered += int64(c.n)
		if ideal[c.key].take(int64(c.at), int64(c.n), int64(t.Limit), int64(window)) {
			res.Ideal += int64(c.n)
		}
		if c.err {
			res.Errors++
		}
		if c.ok {
			res.Admitted += int64(c.n)
			e := Event{At: time.Duration(float64(c.at) * float64(norm) / float64(window)), Key: c.key, N: c.n}
			perKey[c.key] = append(perKey[c.key], Event{At: c.at, Key: c.key, N: c.n})
			res.Timeline = append(res.Timeline, e)
			if t.Recovery && firstDenial >= 0 && math.IsNaN(res.Recovery) {
				res.Recovery = float64(c.at-firstDenial) / float64(window)
			}
		} else if firstDenial < 0 {
			firstDenial = c.at
		}
	}
	if t.Recovery && math.IsNaN(res.Recovery) {
		res.Recovery = -1
	}
	for _, ev := range perKey {
		res.MaxInWindow = max(res.MaxInWindow, maxInWindow(ev, window))
	}
	return res
}

// maxInWindow returns the most units in any half-open interval of length
// w; events are sorted by time. The busiest interval can always be taken
// to start at an event.
func maxInWindow(ev []Event, w time.Duration) int64 {
	var best, sum int64
	j := 0
	for i := range ev {
		for j < len(ev) && ev[j].At < ev[i].At+w {
			sum += int64(ev[j].N)
			j++
		}
		best = max(best, sum)
		sum -= int64(ev[i].N)
	}
	return best
}

// bucket is the exact reference token bucket that defines the ideal:
// capacity limit, refilled at limit per window, starting full. Its level
// is kept in units of 1/window tokens, so the arithmetic is exact.
type bucket struct {
	level   int64 // tokens × window
	last    int64
	started bool
}

func (b *bucket) take(now, n, limit, window int64) bool {
	full := limit * window
	if !b.started {
		b.started, b.level, b.last = true, full, now
	}
	if now > b.last {
		if el := now - b.last; el >= window {
			b.level = full
		} else {
			b.level = min(full, b.level+el*limit)
		}
		b.last = now
	}
	if b.level >= n*window {
		b.level -= n * window
		return true
	}
	return false
}

// drain takes every whole token available at now and returns how many.
func (b *bucket) drain(now, limit, window int64) int64 {
	b.take(now, 0, limit, window) // refill only
	k := b.level / window
	b.level -= k * window
	return k
}

// AccuracyOptions configures RunAccuracy.
type AccuracyOptions struct {
	Subjects []Subject
	Traces   []Trace
	// RealWindow is the window of the wall-clock replays of subjects that
	// take no clock.
	RealWindow time.Duration
}

// RunAccuracy runs every trace on every subject that can run it: on
// virtual time when the subject takes a clock, otherwise on the wall
// clock, all such subjects of a trace at once (the replays mostly sleep).
func RunAccuracy(o AccuracyOptions) ([]AccuracyResult, error) {
	var out []AccuracyResult
	for _, t := range o.Traces {
		var real []Subject
		for _, s := range o.Subjects {
			if !Runs(s, t) {
				continue
			}
			if !s.VirtualTime {
				real = append(real, s)
				continue
			}
			r, err := RunVirtual(s, t)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		rs := make([]AccuracyResult, len(real))
		errs := make([]error, len(real))
		var wg sync.WaitGroup
		for i, s := range real {
			wg.Go(func() { rs[i], errs[i] = RunReal(s, t, o.RealWindow) })
		}
		wg.Wait()
		for i := range real {
			if errs[i] != nil {
				return nil, errs[i]
			}
		}
		out = append(out, rs...)
	}
	return out, nil
}

// ContentionResult is one subject hammered by many goroutines on one key
// on the wall clock.
type ContentionResult struct {
	Subject    Subject
	Goroutines int
	Elapsed    time.Duration
	Calls      int64
	Admitted   int64
	// Ideal is what an exact token bucket (burst Limit, Limit per Window)
	// admits to callers asking without pause during the 50 µs bins in
	// which calls were actually made: on a busy machine the goroutines
	// may get no processor for a while. For a pacer it is
	// Limit×Last/Window, Last being the start of the last call.
	Ideal       float64
	Errors      int64
	MaxInWindow int64
	Limit       int
}

// Ratio returns Admitted/Ideal.
func (c ContentionResult) Ratio() float64 { return float64(c.Admitted) / c.Ideal }

// contentionBin is the resolution at which Contention records when calls
// were made.
const contentionBin = 50 * time.Microsecond

// Contention runs goroutines goroutines calling Allow on one key of s, on
// the wall clock, for d, and counts what was admitted.
func Contention(s Subject, c Config, goroutines int, d time.Duration) (ContentionResult, error) {
	l, err := s.Open(c)
	if err != nil {
		return ContentionResult{}, err
	}
	defer closeLimiter(l)
	nbins := int(d/contentionBin) + 1
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		all     = contention{bins: make([]uint64, (nbins+63)/64)}
		release = make(chan struct{})
		start   time.Time
	)
	for range goroutines {
		wg.Go(func() {
			mine := contention{bins: make([]uint64, len(all.bins))}
			<-release
			mine.run(l, start, d)
			mu.Lock()
			all.add(&mine)
			mu.Unlock()
		})
	}
	start = time.Now()
	close(release)
	wg.Wait()
	slices.Sort(all.admits)
	ev := make([]Event, len(all.admits))
	for i, a := range all.admits {
		ev[i] = Event{At: a, N: 1}
	}
	ideal := float64(c.Limit) * float64(all.last) / float64(c.Window)
	if !s.Blocks {
		ideal = all.ideal(c, nbins)
	}
	return ContentionResult{
		Subject: s, Goroutines: goroutines, Elapsed: all.last, Calls: all.calls,
		Admitted: int64(len(all.admits)), Ideal: ideal, Errors: all.errs,
		MaxInWindow: maxInWindow(ev, c.Window), Limit: c.Limit,
	}, nil
}

// contention is what goroutines of Contention saw.
type contention struct {
	calls, errs int64
	admits      []time.Duration // since the start, of the admissions before the end
	last        time.Duration   // the latest call, since the start
	// bins marks which bins of time saw at least one call: on a busy
	// machine the goroutines may get no processor for a while, and a
	// bucket that is full then cannot bank what it would have earned.
	// The ideal is replayed on these bins.
	bins []uint64
}

// run calls Allow on l's hot key from start until d after it.
func (c *contention) run(l throttle.Limiter, start time.Time, d time.Duration) {
	deadline := start.Add(d)
	for {
		now := time.Now()
		if !now.Before(deadline) {
			return
		}
		c.last = now.Sub(start)
		b := int(c.last / contentionBin)
		c.bins[b/64] |= 1 << (b % 64)
		dec, err := l.Allow(bg, "hot-key", 1)
		c.calls++
		if err != nil {
			c.errs++
		} else if dec.Allowed {
			if at := time.Since(start); at < d {
				c.admits = append(c.admits, at)
			}
		}
	}
}

// add counts what o saw in c.
func (c *contention) add(o *contention) {
	c.calls += o.calls
	c.errs += o.errs
	c.last = max(c.last, o.last)
	c.admits = append(c.admits, o.admits...)
	for i, w := range o.bins {
		c.bins[i] |= w
	}
}

// ideal is what an exact token bucket of cfg admits to callers that never
// pause, over the first nbins bins in which calls were made.
func (c *contention) ideal(cfg Config, nbins int) float64 {
	var ref bucket
	var sum int64
	for b := range nbins {
		if c.bins[b/64]&(1<<(b%64)) != 0 {
			sum += ref.drain(int64(b+1)*int64(contentionBin), int64(cfg.Limit), int64(cfg.Window))
		}
	}
	return float64(sum)
}

var _ throttle.Limiter = (*xrateLimiter)(nil)
