package adaptivesim

import (
	"fmt"
	"io"
	"math/rand/v2"
	"time"
)

// Shapes returns the backends the adaptive limiters are checked on beyond
// Default: few and many servers, exponential and bimodal service times, a
// slow start, and a latency that rises without a queue. Each has the mean
// service time of Default (20 ms); Default is the shape whose capacity
// halves and recovers.
func Shapes() []*Backend {
	ln := LogNormal(Mean, CV)
	steady := func(name string, servers int, svc func(*rand.Rand) time.Duration) *Backend {
		return &Backend{Name: name, Servers: servers, Mean: Mean, Service: svc, End: 60 * time.Second}
	}
	slow := steady("32 servers, slow start (3× slower, back to 1× over 30 s)", 32, ln)
	slow.End = 90 * time.Second
	slow.Slow = func(t time.Duration) float64 { return 1 + 2*max(0, 1-t.Seconds()/30) }
	delay := steady("32 servers, +40 ms of latency outside the servers from 20 s to 50 s", 32, ln)
	delay.End = 90 * time.Second
	delay.Delay = func(t time.Duration) time.Duration {
		return time.Duration(40 * float64(time.Millisecond) * min(1, max(0, (t.Seconds()-20)/30)))
	}
	return []*Backend{
		steady("4 servers, log-normal cv 0.5", 4, ln),
		steady("64 servers, log-normal cv 0.5", 64, ln),
		steady("32 servers, exponential", 32, func(rng *rand.Rand) time.Duration {
			return time.Duration(rng.ExpFloat64() * float64(Mean))
		}),
		steady("32 servers, bimodal (90% 12 ms, 10% 92 ms)", 32, func(rng *rand.Rand) time.Duration {
			if rng.Float64() < 0.1 {
				return 92 * time.Millisecond
			}
			return 12 * time.Millisecond
		}),
		slow,
		Default(),
		delay,
	}
}

// unlimited is a Gate that admits everything.
type unlimited struct{}

func (unlimited) Admit() func(time.Duration) { return func(time.Duration) {} }
func (unlimited) Limit() int                 { return 0 }

// Unloaded returns b's unloaded p99: that of every request at 0.1× load,
// no limit, over the settled spans.
func (b *Backend) Unloaded() time.Duration {
	return scoreBound(b, simulate(b, unlimited{}, 0.1, 1, func(time.Duration) {}), 0.1, 0).P99
}

// RunOn is Run on b; unloaded is b's unloaded p99 (Unloaded), the
// recovery of the p99 is judged against twice it.
func RunOn(b *Backend, g Gate, load float64, seed uint64, at func(time.Duration), unloaded time.Duration) Result {
	return scoreBound(b, simulate(b, g, load, seed, at), load, unloaded)
}

// ShapeGoals returns the goals r misses on a shape at load: goodput ≥ 95%
// of capacity at 1× load and above, and the p99 ≤ 2× the unloaded p99 at
// 3× load and above.
func (r Result) ShapeGoals(load float64, unloaded time.Duration) []string {
	var miss []string
	if load >= 1 && r.Goodput < 0.95 {
		miss = append(miss, fmt.Sprintf("goodput %.1f%% < 95%%", 100*r.Goodput))
	}
	if load >= 3 && r.P99 > 2*unloaded {
		miss = append(miss, fmt.Sprintf("p99 %v > 2 × %v", r.P99.Round(100*time.Microsecond), unloaded.Round(100*time.Microsecond)))
	}
	return miss
}

// ShapeRow is one run on a shape, for WriteShapes.
type ShapeRow struct {
	Shape    string
	Unloaded time.Duration
	Row
	Miss []string
}

// WriteShapes writes the Markdown table of runs on the shapes.
func WriteShapes(w io.Writer, rows []ShapeRow) {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Fprintln(w, "| backend | unloaded p99 | limiter | load | goodput | p99 | goals |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, x := range rows {
		goals := "met"
		if len(x.Miss) > 0 {
			goals = fmt.Sprint("missed: ", x.Miss)
		}
		fmt.Fprintf(w, "| %s | %v | %s | %.0f× | %.1f%% | %v | %s |\n", x.Shape, r(x.Unloaded), x.Name, x.Load,
			100*x.Result.Goodput, r(x.Result.P99), goals)
	}
}
