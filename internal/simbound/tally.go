package simbound

import (
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/throttlekit/throttle/internal/faultsim"
)

// The limits the gossip and the daemon scenarios run: a refill time of
// Burst/Rate = 4 s, long against the gossip Interval (a fresh burst
// stands out) and short against the run's Len (partitions show their
// rate).
const (
	Rate     = 5 // per second
	Burst    = 20
	Interval = 200 * time.Millisecond
	Len      = 20 * time.Second
)

// Spec returns the spec of a cluster scenario: procs processes, every
// fault kind, runs of Len sampled every 100 ms, at most maxEvents faults
// a schedule, the fixed seeds and count random ones.
func Spec(name string, procs, maxEvents int, seeds []uint64, count int) faultsim.Spec {
	return faultsim.Spec{Name: name, Procs: procs, Len: Len, Sample: 100 * time.Millisecond,
		Kinds: faultsim.AllKinds(), MaxEvents: maxEvents, Seeds: seeds, Count: count}
}

// Tally is what the clients of a simulated cluster were told: the units
// admitted per key of its Run, checked at every sample against a bound.
// Safe for concurrent use; the zero value is not usable (NewTally).
type Tally struct {
	Run
	mu     sync.Mutex
	counts []int64
	series *Series
}

// NewTally returns an empty tally of run's keys.
func NewTally(run Run) *Tally {
	return &Tally{Run: run, counts: make([]int64, len(run.Keys)), series: NewSeries(run.Keys)}
}

// Admit counts one unit admitted of key.
func (t *Tally) Admit(key string) {
	t.mu.Lock()
	t.counts[t.KeyIdx[key]]++
	t.mu.Unlock()
}

// Check samples the tally and the clocks' offsets at now and checks
// every window ending then against bound (Series.Add, class name).
// bound runs with the tally locked: it must not call the tally.
func (t *Tally) Check(now time.Duration, clocks []*faultsim.Clock, name string, bound func(Window) float64) error {
	off := Offsets(clocks)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.series.Add(now, slices.Clone(t.counts), off, name, t.Eps, bound)
}

// Clients are the callers of a simulated cluster's processes.
type Clients struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

// StartClients starts callers callers on each of procs processes, each
// asking keys by env's load shape (Drive) at 1.5 × Rate per key and
// process in all, with a generator drawn from env's; ask(i, key) asks
// process i. They run until Stop.
func StartClients(env *faultsim.Env, keys []string, procs, callers int, ask func(proc int, key string)) *Clients {
	c := &Clients{stop: make(chan struct{})}
	for i := range procs {
		for k := range callers {
			rng := rand.New(rand.NewPCG(env.Rand.Uint64(), uint64(i*16+k)))
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				Drive(c.stop, env.Sched.Load, keys, rng, 1.5*Rate/float64(callers), env.Elapsed, func(key string) { ask(i, key) })
			}()
		}
	}
	return c
}

// Stop stops the callers and waits for their last calls to return.
func (c *Clients) Stop() {
	close(c.stop)
	c.wg.Wait()
}
