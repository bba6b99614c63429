package adaptive

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/throttletest"
)

// The simulated backend: servers working a FIFO queue, each request's
// service time drawn from a log-normal distribution (mean 20ms,
// coefficient of variation 0.5). Half the servers go away at halveAt and
// come back at recoverAt.
const (
	simServers   = 32
	simMean      = 20 * time.Millisecond
	simCV        = 0.5
	simCapacity  = simServers * float64(time.Second) / float64(simMean) // requests a second
	simHalveAt   = 60 * time.Second
	simRecoverAt = 120 * time.Second
	simEnd       = 150 * time.Second
	simWarmup    = 10 * time.Second // not counted in goodput and p99
	simSettle    = 10 * time.Second // after a change of capacity
)

// simSigma and simMu parametrise the log-normal service time.
var (
	simSigma = math.Sqrt(math.Log(1 + simCV*simCV))
	simMu    = math.Log(float64(simMean)) - simSigma*simSigma/2
	// simP99 is the unloaded p99 latency: the service time's.
	simP99 = time.Duration(math.Exp(simMu + 2.3263*simSigma))
)

// gate is what the simulation asks before sending a request and tells
// when it finishes.
type gate interface {
	admit() bool
	done(rtt time.Duration)
	limit() int
}

type adaptiveGate struct{ l *Limiter }

func (g adaptiveGate) admit() bool {
	d, _ := g.l.Allow(bg, "", 1)
	return d.Allowed
}
func (g adaptiveGate) done(rtt time.Duration) { _ = g.l.Release(1, rtt, Success) }
func (g adaptiveGate) limit() int             { return g.l.Limit() }

type fixedGate struct{ s *counting.Semaphore }

func (g fixedGate) admit() bool        { return g.s.TryAcquire(1) }
func (g fixedGate) done(time.Duration) { _ = g.s.Release(1) }
func (g fixedGate) limit() int         { return g.s.Limit() }

// simResult is what one run measured.
type simResult struct {
	goodput      float64       // completions / capacity, over the settled spans
	p99          time.Duration // of admitted requests, over the settled spans
	p99Halved    time.Duration // over the settled span at half capacity
	recoverP99   time.Duration // from the halving until every later second's p99 is within 2× simP99
	recoverGood  time.Duration // from the recovery until every later second's goodput is ≥ 95%
	limits       []int         // the limit at the end of each second
	secondP99    []time.Duration
	secondServed []int
}

// simRun drives the backend with open-loop Poisson arrivals at load ×
// the full capacity through g, on virtual time.
func simRun(clk *throttletest.Clock, g gate, load float64, seed uint64) simResult {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	t0 := clk.Now()
	at := func(d time.Duration) { clk.Set(t0.Add(d)) }
	type job struct{ arrived, done time.Duration }
	var (
		heap    []job // running jobs, by done
		queue   []time.Duration
		servers = simServers
		rate    = load * simCapacity
		next    = time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		secs    = int(simEnd / time.Second)
		lat     = make([][]time.Duration, secs)
		served  = make([]int, secs)
		arrived = make([]int, secs)
		res     = simResult{limits: make([]int, secs)}
		sec     = 0
	)
	push := func(j job) {
		heap = append(heap, j)
		for i := len(heap) - 1; i > 0; {
			p := (i - 1) / 2
			if heap[p].done <= heap[i].done {
				break
			}
			heap[p], heap[i] = heap[i], heap[p]
			i = p
		}
	}
	pop := func() job {
		j := heap[0]
		last := len(heap) - 1
		heap[0] = heap[last]
		heap = heap[:last]
		for i := 0; ; {
			c := 2*i + 1
			if c >= len(heap) {
				break
			}
			if c+1 < len(heap) && heap[c+1].done < heap[c].done {
				c++
			}
			if heap[i].done <= heap[c].done {
				break
			}
			heap[i], heap[c] = heap[c], heap[i]
			i = c
		}
		return j
	}
	start := func(now, arrived time.Duration) {
		push(job{arrived: arrived, done: now + time.Duration(math.Exp(simMu+simSigma*rng.NormFloat64()))})
	}
	for {
		now := next
		if len(heap) > 0 && heap[0].done < now {
			now = heap[0].done
		}
		for ; sec < secs && time.Duration(sec+1)*time.Second <= now; sec++ {
			res.limits[sec] = g.limit()
		}
		if now >= simEnd {
			break
		}
		switch {
		case now >= simRecoverAt:
			servers = simServers
		case now >= simHalveAt:
			servers = simServers / 2
		}
		at(now)
		if now == next { // an arrival
			next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			arrived[sec]++
			if !g.admit() {
				continue
			}
			queue = append(queue, now)
		} else { // a completion
			j := pop()
			rtt := j.done - j.arrived
			g.done(rtt)
			lat[sec] = append(lat[sec], rtt)
			served[sec]++
		}
		for len(queue) > 0 && len(heap) < servers {
			start(now, queue[0])
			queue = queue[1:]
		}
	}

	capAt := func(s int) float64 {
		if d := time.Duration(s) * time.Second; d >= simHalveAt && d < simRecoverAt {
			return simCapacity / 2
		}
		return simCapacity
	}
	settled := func(s int) bool {
		d := time.Duration(s) * time.Second
		return d >= simWarmup && !(d >= simHalveAt && d < simHalveAt+simSettle) && !(d >= simRecoverAt && d < simRecoverAt+simSettle)
	}
	var all, halved []time.Duration
	var done, capacity float64
	res.secondP99 = make([]time.Duration, secs)
	res.secondServed = served
	for s := range secs {
		res.secondP99[s] = p99(lat[s])
		if !settled(s) {
			continue
		}
		all = append(all, lat[s]...)
		done += float64(served[s])
		capacity += min(capAt(s), load*simCapacity)
		if d := time.Duration(s) * time.Second; d >= simHalveAt && d < simRecoverAt {
			halved = append(halved, lat[s]...)
		}
	}
	res.goodput, res.p99, res.p99Halved = done/capacity, p99(all), p99(halved)
	// The first second from which every second to the next change is good.
	settle := func(from, to time.Duration, good func(s int) bool) time.Duration {
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
	res.recoverP99 = settle(simHalveAt, simRecoverAt, func(s int) bool { return res.secondP99[s] <= 2*simP99 })
	res.recoverGood = settle(simRecoverAt, simEnd, func(s int) bool { // over 3 s, against what arrived
		var got, want float64
		for i := max(s-2, 0); i <= s; i++ {
			got += float64(served[i])
			want += min(capAt(i), float64(arrived[i]))
		}
		return got >= 0.95*want
	})
	return res
}

func p99(l []time.Duration) time.Duration {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[(len(l)*99-1)/100]
}

// simSubjects are the gates the simulation compares: the three
// algorithms, and a fixed limit set right (a quarter above the servers)
// and set twice too high.
var simSubjects = []struct {
	name string
	new  func(clk throttle.Clock) gate
}{
	{"AIMD", func(clk throttle.Clock) gate {
		return adaptiveGate{mustLimiter(&AIMD{}, Config{Timeout: 2 * simP99}, clk)}
	}},
	{"Vegas", func(clk throttle.Clock) gate { return adaptiveGate{mustLimiter(&Vegas{}, Config{}, clk)} }},
	{"Gradient2", func(clk throttle.Clock) gate { return adaptiveGate{mustLimiter(&Gradient2{}, Config{}, clk)} }},
	{"Gradient2 tol 1", func(clk throttle.Clock) gate {
		return adaptiveGate{mustLimiter(&Gradient2{Tolerance: 1}, Config{}, clk)}
	}},
	{"fixed 40", func(throttle.Clock) gate { return fixedGate{mustSemaphore(simServers * 5 / 4)} }},
	{"fixed 80", func(throttle.Clock) gate { return fixedGate{mustSemaphore(simServers * 5 / 2)} }},
}

func mustLimiter(alg Algorithm, c Config, clk throttle.Clock) *Limiter {
	l, err := New(alg, c, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	return l
}

func mustSemaphore(n int) *counting.Semaphore {
	s, err := counting.NewSemaphore(n)
	if err != nil {
		panic(err)
	}
	return s
}

// TestSimulation runs every subject at 0.5×, 1× and 3× load on the
// simulated backend and prints the table of docs/adaptive.md (go test
// -run TestSimulation -v ./adaptive). It asserts the goals the adaptive
// limiters meet: goodput ≥ 95% of capacity at 1× and 3× load and, at 3×
// load, back to 95% within 10 s of the capacity's recovery; at 3× load,
// the p99 of admitted requests ≤ 2× the unloaded p99 and back under that
// bound within 5 s of the halving.
func TestSimulation(t *testing.T) {
	loads, subjects := []float64{0.5, 1, 3}, simSubjects
	if raceOn { // the race detector makes the whole table take a minute: check the goals at 3× only
		loads, subjects = []float64{3}, simSubjects[:4]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d servers, service time log-normal mean %v cv %.1f (unloaded p99 %v, bound %v), capacity %.0f/s, halved at %v, back at %v\n\n",
		simServers, simMean, simCV, simP99.Round(100*time.Microsecond), (2 * simP99).Round(100*time.Microsecond), simCapacity, simHalveAt, simRecoverAt)
	fmt.Fprintln(&b, "| limiter | load | goodput | p99 | p99 at half capacity | p99 back under bound after halving | goodput back ≥ 95% after recovery |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|")
	curves := map[string]simResult{}
	for _, s := range subjects {
		for _, load := range loads {
			clk := throttletest.NewClock()
			r := simRun(clk, s.new(clk), load, 1)
			fmt.Fprintf(&b, "| %s | %.1f× | %.1f%% | %v | %v | %v | %v |\n", s.name, load, 100*r.goodput,
				r.p99.Round(100*time.Microsecond), r.p99Halved.Round(100*time.Microsecond), r.recoverP99, r.recoverGood)
			if load == 3 {
				curves[s.name] = r
			}
			if strings.HasPrefix(s.name, "fixed") {
				continue
			}
			if load >= 1 && r.goodput < 0.95 {
				t.Errorf("%s at %.1f×: goodput %.1f%% < 95%%", s.name, load, 100*r.goodput)
			}
			if load < 3 {
				continue
			}
			if r.recoverGood > 10*time.Second {
				t.Errorf("%s at 3×: goodput back to 95%% %v after the recovery, > 10s", s.name, r.recoverGood)
			}
			if r.p99 > 2*simP99 || r.recoverP99 > 5*time.Second {
				t.Errorf("%s at 3×: p99 %v (bound 2 × %v), back under the bound %v after the halving (> 5s)", s.name, r.p99, simP99, r.recoverP99)
			}
		}
	}
	fmt.Fprintln(&b, "\nAt 3× load, every 10 s: limit / p99 (ms) / served per second")
	fmt.Fprint(&b, "\n| t (s) |")
	for _, s := range subjects {
		fmt.Fprintf(&b, " %s |", s.name)
	}
	fmt.Fprint(&b, "\n|---|")
	for range subjects {
		fmt.Fprint(&b, "---|")
	}
	fmt.Fprintln(&b)
	for sec := 5; sec < int(simEnd/time.Second); sec += 10 {
		fmt.Fprintf(&b, "| %d |", sec)
		for _, s := range subjects {
			r := curves[s.name]
			fmt.Fprintf(&b, " %d / %.0f / %d |", r.limits[sec], float64(r.secondP99[sec])/float64(time.Millisecond), r.secondServed[sec])
		}
		fmt.Fprintln(&b)
	}
	t.Log("\n" + b.String())
}
