package storelimit_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/faultsim"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// storeSpec: process 0 is the store, processes 1-4 share it, each with
// its own Limiter and its own clock (steps and skew: the store reads no
// clock, each call carries its caller's). A Config event rolls a new
// limit (rate and burst) out to the processes one after the other.
var storeSpec = faultsim.Spec{
	Name:      "Store",
	Procs:     5,
	Len:       20 * time.Second,
	Sample:    50 * time.Millisecond,
	Kinds:     faultsim.AllKinds(),
	MaxEvents: 10,
	Hot:       []int{0},
	Seeds:     faultsim.Range(1, 60),
	Count:     20,
}

// TestSimStore runs Limiters of four processes over one in-memory store
// whose calls go through the simulated network: calls and answers lost
// (an answer lost after the write), delayed past the caller's timeout,
// duplicated; the store paused, or restarted (with its state kept or, by
// the seed, lost); a process paused or restarted; a process's clock
// stepped or skewed; the limit changed process by process. It checks at
// every sample, for each key and every interval [t0, t] between samples,
// that the units the processes were told were admitted add up to at most
// storeBound, and that every Allow returns within its timeout.
func TestSimStore(t *testing.T) {
	faultsim.Run(t, storeSpec, newStoreWorld)
}

const (
	storeRate    = 100 // units per second, before any Config
	storeBurst   = 20
	storeTimeout = 100 * time.Millisecond // of one Allow
)

// storeLimits are the limits a Config event picks from: (rate, burst).
var storeLimits = [][2]int{{100, 20}, {50, 20}, {200, 10}, {100, 40}, {25, 5}}

// storeKeys are the keys the load asks.
var storeKeys = []string{"hot", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}

type storeWorld struct {
	env     *faultsim.Env
	durable bool // the store keeps its state across a restart
	procs   []*storeProc

	mu      sync.Mutex
	store   *storelimit.Memory // nil while the store is down
	losses  []time.Duration    // restarts that lost the store's state
	counts  []int64            // admitted units per key of storeKeys
	samples []storeSample
}

// storeSample is what Check saw at t: the admitted units per key, the
// least and the most clock offset of the processes, and the largest rate
// and refill time of the limits in use.
type storeSample struct {
	t              time.Duration
	counts         []int64
	offMin, offMax time.Duration
	rate           float64
	tau            time.Duration
}

// storeProc is one process sharing the store.
type storeProc struct {
	i      int
	lim    [2]int // its limit: rate, burst
	l      atomic.Pointer[storelimit.Limiter]
	stop   context.CancelFunc
	done   chan struct{}
	paused bool
}

func newStoreWorld(env *faultsim.Env) faultsim.World {
	w := &storeWorld{env: env, durable: env.Rand.IntN(2) == 0, store: new(storelimit.Memory),
		counts: make([]int64, len(storeKeys))}
	env.Describe(fmt.Sprintf("store durable across restarts: %v", w.durable))
	for i := 1; i < env.Spec.Procs; i++ {
		p := &storeProc{i: i, lim: [2]int{storeRate, storeBurst}}
		w.procs = append(w.procs, p)
		w.start(p)
	}
	return w
}

// limiter returns a new Limiter of p's limit, on p's clock. Called with
// w.mu held.
func (w *storeWorld) limiter(p *storeProc) *storelimit.Limiter {
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(p.lim[0]), p.lim[1])
	if err != nil {
		w.env.T.Fatal(err)
	}
	l, err := storelimit.New(&simStore{w: w, proc: p.i}, alg, throttle.WithClock(w.env.Clocks[p.i]))
	if err != nil {
		w.env.T.Fatal(err)
	}
	storelimit.SetBatchSlots(l, 1) // a second swap in flight waits for a batch
	return l
}

// start starts a new life of p: a new Limiter, its guesses lost. Called
// with w.mu held, or before the run.
func (w *storeWorld) start(p *storeProc) {
	p.l.Store(w.limiter(p))
	ctx, stop := context.WithCancel(context.Background())
	p.stop, p.done = stop, make(chan struct{})
	r := rand.New(rand.NewPCG(w.env.Rand.Uint64(), uint64(p.i)))
	go w.load(ctx, p, r)
}

// storeInFlight bounds the calls of one process in flight at once: a
// call that outlasts the gap to the next overlaps it, on its key (a
// round) or another (a batch).
const storeInFlight = 4

// load asks for units until ctx ends, by the schedule's load shape: on
// the hot key, or on three keys at a time of the others, moving on every
// 50 calls.
func (w *storeWorld) load(ctx context.Context, p *storeProc, r *rand.Rand) {
	var calls sync.WaitGroup
	slots := make(chan struct{}, storeInFlight)
	defer func() {
		calls.Wait()
		close(p.done)
	}()
	for n := 0; ; n++ {
		gap := time.Duration(1+r.IntN(20)) * time.Millisecond
		if w.env.Sched.Load == faultsim.Bursty && (n/200)%2 == 1 {
			gap = 200 * time.Millisecond // quiet, then a burst again
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		w.mu.Lock()
		paused := p.paused
		w.mu.Unlock()
		if paused {
			continue
		}
		key := 0
		if w.env.Sched.Load == faultsim.NewKeys {
			key = 1 + (n/50+n%3)%8
		}
		units := 1 + r.IntN(3)
		select {
		case <-ctx.Done():
			return
		case slots <- struct{}{}:
		}
		l := p.l.Load()
		calls.Go(func() {
			defer func() { <-slots }()
			w.allow(ctx, l, key, units)
		})
	}
}

// allow asks l for n units of key and counts them when admitted.
func (w *storeWorld) allow(ctx context.Context, l *storelimit.Limiter, key, n int) {
	cctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	var d throttle.Decision
	var err error
	w.env.Within("Limiter.Allow", storeTimeout+10*time.Millisecond, func() { d, err = l.Allow(cctx, storeKeys[key], n) })
	if err == nil && d.Allowed {
		w.mu.Lock()
		w.counts[key] += int64(n)
		w.mu.Unlock()
	}
}

func (w *storeWorld) Apply(e faultsim.Event) {
	if e.Kind == faultsim.Config {
		w.rollOut(e)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case e.From == 0 && e.Kind == faultsim.Crash && !w.durable:
		w.store = nil
	case e.From == 0:
	case e.Kind == faultsim.Pause:
		w.procs[e.From-1].paused = true
	case e.Kind == faultsim.Crash:
		p := w.procs[e.From-1]
		p.stop()
		w.mu.Unlock()
		<-p.done
		w.mu.Lock()
	}
}

// rollOut changes the limit to one of storeLimits (by e.Value), process
// by process in a random order, a random gap of up to 300 ms apart, as
// an operator rolls a configuration out: each process swaps its Limiter
// for one of the new limit over the same store.
func (w *storeWorld) rollOut(e faultsim.Event) {
	lim := storeLimits[e.Value%uint64(len(storeLimits))]
	r := rand.New(rand.NewPCG(e.Value, 0xc0f))
	gap := time.Duration(r.Int64N(int64(300 * time.Millisecond)))
	for k, i := range r.Perm(len(w.procs)) {
		p := w.procs[i]
		time.AfterFunc(time.Duration(k)*gap, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			p.lim = lim
			p.l.Store(w.limiter(p))
		})
	}
}

func (w *storeWorld) End(e faultsim.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case e.From == 0 && e.Kind == faultsim.Crash && !w.durable:
		w.store = new(storelimit.Memory)
		w.losses = append(w.losses, w.env.Elapsed())
	case e.From == 0:
	case e.Kind == faultsim.Pause:
		w.procs[e.From-1].paused = false
	case e.Kind == faultsim.Crash:
		w.start(w.procs[e.From-1])
	}
}

// Check checks every interval [t0, now] between samples against
// storeBound.
func (w *storeWorld) Check(now time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := storeSample{t: now, counts: slices.Clone(w.counts), offMin: math.MaxInt64, offMax: math.MinInt64}
	for _, p := range w.procs {
		off := w.env.Clocks[p.i].Offset()
		cur.offMin, cur.offMax = min(cur.offMin, off), max(cur.offMax, off)
		cur.rate = max(cur.rate, float64(p.lim[0]))
		cur.tau = max(cur.tau, time.Duration(p.lim[1])*time.Second/time.Duration(p.lim[0]))
	}
	w.samples = append(w.samples, cur)
	return storeCheck(w.samples, w.losses)
}

// storeCheck checks every window ending at the last of samples.
//
// The bound: on a token bucket (GCRA) each admission of n units moves the
// key's stored instant of fullness (TAT) forward by at least n/r of the
// fastest limit, never back but when the store loses it; an admission by
// a process reading now requires TAT ≤ now + τ (τ = burst/rate, the
// refill time of a full bucket); the first admission of a window sets TAT
// ≥ the reading of the clock of the process that decided it, which read
// it at most the call timeout T before the window. So the units admitted
// in [t0, t] are at most
//
//	r·(t − t0 + (1+L)·(τ + T + s))
//
// with r the largest rate and τ the largest refill time of the limits in
// use over the window, L the store restarts that lost its state in it,
// and s the clock spread: the most a process's clock at some instant of
// the window is ahead of another's (or its own) at an earlier instant.
// Clocks that agree give burst + r·(t − t0 + T); a clock stepped back
// adds nothing (it never re-admits); a clock ahead of the others by δ, or
// stepped forward by δ, adds r·δ.
func storeCheck(samples []storeSample, losses []time.Duration) error {
	last := len(samples) - 1
	cur := samples[last]
	// drift is what a skewed clock may move between two samples unseen.
	drift := time.Duration(0.05 * float64(storeSpec.Sample))
	// samples[f:] are folded into sufMax (their most offset), spread, rate
	// and tau.
	f, sufMax := last+1, time.Duration(math.MinInt64)
	var spread, tau time.Duration
	rate := 0.0
	for j := last - 1; j >= 0; j-- {
		t0 := samples[j].t
		// The window [t0, t] reads the samples from the last at or before
		// t0 − T on: its first admission read its clock after t0 − T.
		for f > 0 && (f > j || samples[f].t > t0-storeTimeout) {
			f--
			s := samples[f]
			sufMax = max(sufMax, s.offMax)
			spread = max(spread, sufMax-s.offMin)
			rate, tau = max(rate, s.rate), max(tau, s.tau)
		}
		lost := 0
		for _, at := range losses {
			if at > t0-storeTimeout && at <= cur.t {
				lost++
			}
		}
		b := rate * (cur.t - t0 + time.Duration(1+lost)*(tau+storeTimeout+spread+drift)).Seconds()
		for k, c := range cur.counts {
			if got := float64(c - samples[j].counts[k]); got > b+1e-9 {
				return fmt.Errorf("admitted over the bucket: key %q: %.0f units admitted in [%v, %v], bound %.1f (rate %.0f, refill %v, clock spread %v, store states lost %d)",
					storeKeys[k], got, t0, cur.t, b, rate, tau, spread, lost)
			}
		}
	}
	return nil
}

func (w *storeWorld) Close() {
	for _, p := range w.procs {
		p.stop()
		<-p.done
	}
}

// simStore is a process's storelimit.BatchStore: each call (a batch
// too) is a request and an answer through the simulated network to the
// store's process; a call whose answer does not come before ctx ends
// fails (whether or not the store applied it).
type simStore struct {
	w    *storeWorld
	proc int
}

var _ storelimit.BatchStore = (*simStore)(nil)

func (s *simStore) Load(ctx context.Context, key string, now int64) (int64, error) {
	a := s.call(ctx, func(m *storelimit.Memory) (a storeAnswer) {
		a.state, a.err = m.Load(ctx, key, now)
		return a
	})
	return a.state, a.err
}

func (s *simStore) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	_, ok, err := s.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	return ok, err
}

func (s *simStore) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	a := s.call(ctx, func(m *storelimit.Memory) (a storeAnswer) {
		a.state, a.ok, a.err = m.CompareAndSwapLoad(context.Background(), key, old, next, now, expires)
		return a
	})
	return a.state, a.ok, a.err
}

// CompareAndSwapBatch sends every swap in one request; each delivery of
// it (a duplicate too) works on its own copy.
func (s *simStore) CompareAndSwapBatch(ctx context.Context, swaps []storelimit.Swap) error {
	in := slices.Clone(swaps)
	a := s.call(ctx, func(m *storelimit.Memory) (a storeAnswer) {
		a.swaps = slices.Clone(in)
		a.err = m.CompareAndSwapBatch(context.Background(), a.swaps)
		return a
	})
	if a.err == nil {
		copy(swaps, a.swaps)
	}
	return a.err
}

type storeAnswer struct {
	state int64
	ok    bool
	swaps []storelimit.Swap
	err   error
}

// call runs op at the store, on the network's goroutine when the request
// arrives, and waits for the answer.
func (s *simStore) call(ctx context.Context, op func(*storelimit.Memory) storeAnswer) storeAnswer {
	net := s.w.env.Net
	answers := make(chan storeAnswer, 2) // room for a duplicate's
	net.Send(s.proc, 0, func() {
		s.w.mu.Lock()
		m := s.w.store
		s.w.mu.Unlock()
		if m == nil {
			return
		}
		a := op(m)
		net.Send(0, s.proc, func() {
			select {
			case answers <- a:
			default:
			}
		})
	})
	select {
	case a := <-answers:
		return a
	case <-ctx.Done():
		return storeAnswer{err: fmt.Errorf("store call: %w", ctx.Err())}
	}
}
