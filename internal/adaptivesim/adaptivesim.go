// Package adaptivesim simulates a backend of known capacity under
// open-loop load, on virtual time, to compare concurrency limiters side by
// side: package adaptive's algorithms, fixed limits, and any other limiter
// behind a Gate. It is an internal test and benchmark aid (package adaptive's
// TestSimulation and the benchmarks module run it), not for production.
//
// A run lasts End (150 s) on a backend of Servers servers whose capacity
// halves at HalveAt and recovers at RecoverAt. Result holds the goodput,
// the p99 latency of admitted requests, how soon both come back after each
// change of capacity, and per-second curves; Goals checks a Result
// against the goals docs/adaptive.md states.
package adaptivesim

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/throttletest"
)

// The simulated backend: Servers working a FIFO queue, each request's
// service time drawn from a log-normal distribution (mean Mean,
// coefficient of variation CV). Half the servers go away at HalveAt and
// come back at RecoverAt; a run ends at End.
const (
	Servers   = 32
	Mean      = 20 * time.Millisecond
	CV        = 0.5
	Capacity  = Servers * float64(time.Second) / float64(Mean) // requests a second
	HalveAt   = 60 * time.Second
	RecoverAt = 120 * time.Second
	End       = 150 * time.Second
	Warmup    = 10 * time.Second // not counted in goodput and p99
	Settle    = 10 * time.Second // after a change of capacity
)

// sigma and mu parametrise the log-normal service time.
var (
	sigma = math.Sqrt(math.Log(1 + CV*CV))
	mu    = math.Log(float64(Mean)) - sigma*sigma/2
	// P99 is the unloaded p99 latency: the service time's.
	P99 = time.Duration(math.Exp(mu + 2.3263*sigma))
)

// Result is what one run measured.
type Result struct {
	Goodput      float64         // completions ÷ capacity (or the load offered, if less), over the settled spans
	P99          time.Duration   // of admitted requests, over the settled spans
	P99Halved    time.Duration   // over the settled span at half capacity
	RecoverP99   time.Duration   // from the halving until every later second's p99 is within 2× P99
	RecoverGood  time.Duration   // from the recovery until every later 3 s span served ≥ 95% of what arrived, up to capacity
	Limits       []int           // the limit at the end of each second
	SecondP99    []time.Duration // the p99 of the requests that finished in each second
	SecondServed []int           // the requests that finished in each second
}

// Run drives the backend with open-loop Poisson arrivals at load × the
// full Capacity through g, on virtual time: before each event it calls
// at with the event's time since the start of the run, and at must move
// the clock g reads there (see OnClock). Runs with the same seed see the
// same arrivals and service times.
func Run(g Gate, load float64, seed uint64, at func(time.Duration)) Result {
	return score(Default(), simulate(Default(), g, load, seed, at), load)
}

// Backend is a simulated backend's shape: Servers working one FIFO queue,
// service times drawn by Service (at full speed; mean Mean), Slow times
// them at t (a slow start; nil: 1), Delay adds latency outside the
// servers at t (a network or a dependency slowing down, with no queue;
// nil: none), and half the servers go away from HalveAt to RecoverAt (0:
// never). A run ends at End.
type Backend struct {
	Name               string
	Servers            int
	Mean               time.Duration
	Service            func(rng *rand.Rand) time.Duration
	Slow               func(t time.Duration) float64
	Delay              func(t time.Duration) time.Duration
	HalveAt, RecoverAt time.Duration
	End                time.Duration
}

// Default is the backend of Run and of the package's constants.
func Default() *Backend {
	return &Backend{Name: fmt.Sprintf("%d servers, log-normal cv %.1f, halved and back", Servers, CV), Servers: Servers, Mean: Mean,
		Service: LogNormal(Mean, CV), HalveAt: HalveAt, RecoverAt: RecoverAt, End: End}
}

// LogNormal returns a service time drawn from a log-normal distribution
// of mean and coefficient of variation cv.
func LogNormal(mean time.Duration, cv float64) func(*rand.Rand) time.Duration {
	sg := math.Sqrt(math.Log(1 + cv*cv))
	m := math.Log(float64(mean)) - sg*sg/2
	return func(rng *rand.Rand) time.Duration { return time.Duration(math.Exp(m + sg*rng.NormFloat64())) }
}

// Capacity is what b serves a second at full speed.
func (b *Backend) Capacity() float64 {
	return float64(b.Servers) * float64(time.Second) / float64(b.Mean)
}

// servers is how many servers b has at t.
func (b *Backend) servers(t time.Duration) int {
	if b.HalveAt > 0 && t >= b.HalveAt && t < b.RecoverAt {
		return b.Servers / 2
	}
	return b.Servers
}

// capAt is what b can serve in second s.
func (b *Backend) capAt(s int) float64 {
	t := time.Duration(s)*time.Second + time.Second/2
	c := float64(b.servers(t)) * float64(time.Second) / float64(b.Mean)
	if b.Slow != nil {
		c /= b.Slow(t)
	}
	return c
}

// settled reports whether second s counts in goodput and p99: after the
// warm-up, and not within Settle of a change of capacity.
func (b *Backend) settled(s int) bool {
	d := time.Duration(s) * time.Second
	if d < Warmup {
		return false
	}
	return b.HalveAt == 0 || !(d >= b.HalveAt && d < b.HalveAt+Settle) && !(d >= b.RecoverAt && d < b.RecoverAt+Settle)
}

// job is a request admitted by the gate.
type job struct {
	arrived, done time.Duration
	served, delay time.Duration // with a Backend.Delay: when its service ends, and the delay after
	release       func(rtt time.Duration)
}

// jobHeap is a min-heap of running jobs by done.
type jobHeap []job

func (h *jobHeap) push(j job) {
	*h = append(*h, j)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if q[p].done <= q[i].done {
			break
		}
		q[p], q[i] = q[i], q[p]
		i = p
	}
}

func (h *jobHeap) pop() job {
	q := *h
	j := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	*h = q
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(q) {
			break
		}
		if c+1 < len(q) && q[c+1].done < q[c].done {
			c++
		}
		if q[i].done <= q[c].done {
			break
		}
		q[i], q[c] = q[c], q[i]
		i = c
	}
	return j
}

// tally is what a run counted in each second.
type tally struct {
	lat     [][]time.Duration // latencies of the requests finished
	served  []int             // requests finished
	arrived []int             // requests arrived
	limits  []int             // the gate's limit at the end
}

// simulate runs the events of Run on b: arrivals, admissions and
// completions on b's servers.
func simulate(b *Backend, g Gate, load float64, seed uint64, at func(time.Duration)) tally {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var (
		running jobHeap
		queue   []job // admitted, waiting for a server
		rate    = load * b.Capacity()
		next    = time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		secs    = int(b.End / time.Second)
		t       = tally{lat: make([][]time.Duration, secs), served: make([]int, secs), arrived: make([]int, secs), limits: make([]int, secs)}
		sec     = 0
		busy    = 0 // servers working: running jobs not past their service
	)
	for {
		now := next
		if len(running) > 0 && running[0].done < now {
			now = running[0].done
		}
		for ; sec < secs && time.Duration(sec+1)*time.Second <= now; sec++ {
			t.limits[sec] = g.Limit()
		}
		if now >= b.End {
			return t
		}
		at(now)
		if now == next { // an arrival
			next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			t.arrived[sec]++
			if release := g.Admit(); release != nil {
				queue = append(queue, job{arrived: now, release: release})
			}
		} else { // a completion, or a job leaving its server
			j := running.pop()
			if j.served > 0 { // its service ends; its extra delay begins
				busy--
				j.done, j.served = j.done+j.delay, 0
				running.push(j)
			} else {
				if j.delay == 0 {
					busy--
				}
				rtt := j.done - j.arrived
				j.release(rtt)
				t.lat[sec] = append(t.lat[sec], rtt)
				t.served[sec]++
			}
		}
		for len(queue) > 0 && busy < b.servers(now) {
			busy++
			queue[0].start(b, now, rng)
			running.push(queue[0])
			queue = queue[1:]
		}
	}
}

// start puts j on a server at now: it is done after its service time and
// b's delay (served is when its service ends, if a delay follows).
func (j *job) start(b *Backend, now time.Duration, rng *rand.Rand) {
	svc := b.Service(rng)
	if b.Slow != nil {
		svc = time.Duration(float64(svc) * b.Slow(now))
	}
	j.done = now + svc
	if b.Delay != nil {
		if j.delay = b.Delay(now); j.delay > 0 {
			j.served = j.done // the delay is added when the service ends
		}
	}
}

// score is the Result of a run on b at load that counted t.
func score(b *Backend, t tally, load float64) Result {
	return scoreBound(b, t, load, P99)
}

// scoreBound is score with unloaded as the unloaded p99 the recovery of
// the p99 is judged against (against twice it).
func scoreBound(b *Backend, t tally, load float64, unloaded time.Duration) Result {
	secs := len(t.served)
	res := Result{Limits: t.limits, SecondP99: make([]time.Duration, secs), SecondServed: t.served}
	var all, halved []time.Duration
	var done, capacity float64
	offered := load * b.Capacity()
	for s := range secs {
		res.SecondP99[s] = p99(t.lat[s])
		if !b.settled(s) {
			continue
		}
		all = append(all, t.lat[s]...)
		done += float64(t.served[s])
		capacity += min(b.capAt(s), offered)
		if d := time.Duration(s) * time.Second; b.HalveAt > 0 && d >= b.HalveAt && d < b.RecoverAt {
			halved = append(halved, t.lat[s]...)
		}
	}
	res.Goodput, res.P99, res.P99Halved = done/capacity, p99(all), p99(halved)
	if b.HalveAt == 0 {
		return res
	}
	res.RecoverP99 = settle(b.HalveAt, b.RecoverAt, func(s int) bool { return res.SecondP99[s] <= 2*unloaded })
	res.RecoverGood = settle(b.RecoverAt, b.End, func(s int) bool { // over 3 s, against what arrived
		var got, want float64
		for i := max(s-2, 0); i <= s; i++ {
			got += float64(t.served[i])
			want += min(b.capAt(i), float64(t.arrived[i]))
		}
		return got >= 0.95*want
	})
	return res
}

// settle is the time from from to the end of the first second from which
// every second up to to is good (to - from if none is).
func settle(from, to time.Duration, good func(s int) bool) time.Duration {
	first := -1
	for s := int(from / time.Second); s < int(to/time.Second); s++ {
		if !good(s) {
			first = -1
		} else if first < 0 {
			first = s
		}
	}
	if first < 0 {
		return to - from
	}
	return time.Duration(first)*time.Second + time.Second - from
}

func p99(l []time.Duration) time.Duration {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[(len(l)*99-1)/100]
}

// Gate is the limiter under test. Admit is asked before a request is
// sent: it returns nil to drop it, or the func Run calls with the
// request's latency when it finishes. Limit is the current limit, sampled
// once a second for the curves. Run calls them from one goroutine.
type Gate interface {
	Admit() (release func(rtt time.Duration))
	Limit() int
}

// LimiterGate is a Gate over an adaptive.Limiter, reporting every request
// as a Success.
type LimiterGate struct{ L *adaptive.Limiter }

// Admit implements Gate.
func (g LimiterGate) Admit() func(time.Duration) {
	if d, _ := g.L.Allow(context.Background(), "", 1); !d.Allowed {
		return nil
	}
	return g.release
}

func (g LimiterGate) release(rtt time.Duration) { _ = g.L.Release(1, rtt, adaptive.Success) }

// Limit implements Gate.
func (g LimiterGate) Limit() int { return g.L.Limit() }

// FixedGate is a Gate over a fixed limit, a counting.Semaphore.
type FixedGate struct{ S *counting.Semaphore }

// Admit implements Gate.
func (g FixedGate) Admit() func(time.Duration) {
	if d, err := g.S.AllowN(1); err != nil || !d.Allowed {
		return nil
	}
	return g.release
}

func (g FixedGate) release(time.Duration) { _ = g.S.Release(1) }

// Limit implements Gate.
func (g FixedGate) Limit() int { return g.S.Limit() }

// OnClock returns the at of Run for gates that read clk: it sets clk to
// the run's start, as clk read when OnClock was called, plus d.
func OnClock(clk *throttletest.Clock) func(d time.Duration) {
	t0 := clk.Now()
	return func(d time.Duration) { clk.Set(t0.Add(d)) }
}

// Subject is a limiter the simulation compares: New builds a fresh Gate
// reading clk. Fixed marks the fixed limits, which Goals does not bind.
type Subject struct {
	Name  string
	Fixed bool
	New   func(clk throttle.Clock) Gate
}

// Subjects returns this module's subjects: AIMD (with Config.Timeout at
// 2× the unloaded p99, its loss signal), Vegas, Gradient2 at its defaults
// and with Tolerance 1, and a fixed limit set right (a quarter above the
// servers) and set twice too high.
func Subjects() []Subject {
	lim := func(alg func() adaptive.Algorithm, c adaptive.Config) func(throttle.Clock) Gate {
		return func(clk throttle.Clock) Gate {
			l, err := adaptive.New(alg(), c, throttle.WithClock(clk))
			if err != nil {
				panic(err)
			}
			return LimiterGate{l}
		}
	}
	fixed := func(n int) func(throttle.Clock) Gate {
		return func(throttle.Clock) Gate {
			s, err := counting.NewSemaphore(n)
			if err != nil {
				panic(err)
			}
			return FixedGate{s}
		}
	}
	return []Subject{
		{Name: "AIMD", New: lim(func() adaptive.Algorithm { return &adaptive.AIMD{} }, adaptive.Config{Timeout: 2 * P99})},
		{Name: "Vegas", New: lim(func() adaptive.Algorithm { return &adaptive.Vegas{} }, adaptive.Config{})},
		{Name: "Gradient2", New: lim(func() adaptive.Algorithm { return &adaptive.Gradient2{} }, adaptive.Config{})},
		{Name: "Gradient2 tol 1", New: lim(func() adaptive.Algorithm { return &adaptive.Gradient2{Tolerance: 1} }, adaptive.Config{})},
		{Name: fmt.Sprintf("fixed %d", Servers*5/4), Fixed: true, New: fixed(Servers * 5 / 4)},
		{Name: fmt.Sprintf("fixed %d", Servers*5/2), Fixed: true, New: fixed(Servers * 5 / 2)},
	}
}

// Goals returns the goals r misses at load (nil when it meets them all):
// goodput ≥ 95% of capacity at 1× load and above and, at 3× load and
// above, goodput back to 95% within 10 s of the recovery, the p99 of
// admitted requests ≤ 2× the unloaded P99, and back under that bound
// within 5 s of the halving.
func (r Result) Goals(load float64) []string {
	var miss []string
	if load >= 1 && r.Goodput < 0.95 {
		miss = append(miss, fmt.Sprintf("goodput %.1f%% < 95%%", 100*r.Goodput))
	}
	if load < 3 {
		return miss
	}
	if r.RecoverGood > 10*time.Second {
		miss = append(miss, fmt.Sprintf("goodput back to 95%% %v after the recovery, > 10s", r.RecoverGood))
	}
	if r.P99 > 2*P99 {
		miss = append(miss, fmt.Sprintf("p99 %v > 2 × %v", r.P99, P99))
	}
	if r.RecoverP99 > 5*time.Second {
		miss = append(miss, fmt.Sprintf("p99 back under the bound %v after the halving, > 5s", r.RecoverP99))
	}
	return miss
}

// Row is one run, for the tables.
type Row struct {
	Name   string
	Load   float64
	Result Result
}

// WriteTable writes the Markdown table of rows: a line on the backend,
// then goodput, p99 and the recovery times of each run.
func WriteTable(w io.Writer, rows []Row) {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Fprintf(w, "%d servers, service time log-normal mean %v cv %.1f (unloaded p99 %v, bound %v), capacity %.0f/s, halved at %v, back at %v\n\n",
		Servers, Mean, CV, r(P99), r(2*P99), Capacity, HalveAt, RecoverAt)
	fmt.Fprintln(w, "| limiter | load | goodput | p99 | p99 at half capacity | p99 back under bound after halving | goodput back ≥ 95% after recovery |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, x := range rows {
		fmt.Fprintf(w, "| %s | %.1f× | %.1f%% | %v | %v | %v | %v |\n", x.Name, x.Load, 100*x.Result.Goodput,
			r(x.Result.P99), r(x.Result.P99Halved), x.Result.RecoverP99, x.Result.RecoverGood)
	}
}

// WriteCurves writes the Markdown table of the curves of rows (one load):
// every 10 s, each one's limit / p99 in ms / requests served that second.
func WriteCurves(w io.Writer, rows []Row) {
	fmt.Fprint(w, "| t (s) |")
	for _, x := range rows {
		fmt.Fprintf(w, " %s |", x.Name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(rows)))
	for sec := 5; sec < int(End/time.Second); sec += 10 {
		fmt.Fprintf(w, "| %d |", sec)
		for _, x := range rows {
			fmt.Fprintf(w, " %d / %.0f / %d |", x.Result.Limits[sec], float64(x.Result.SecondP99[sec])/float64(time.Millisecond), x.Result.SecondServed[sec])
		}
		fmt.Fprintln(w)
	}
}
