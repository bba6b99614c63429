package storelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/faultsim"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// storeSpec: process 0 is the store, processes 1-4 share it, each with
// its own Limiter. Clock faults are left out: the guarantee assumes
// synchronised clocks (see the package doc).
var storeSpec = faultsim.Spec{
	Name:   "Store",
	Procs:  5,
	Len:    20 * time.Second,
	Sample: 50 * time.Millisecond,
	Kinds: []faultsim.Kind{faultsim.Loss, faultsim.Duplicate, faultsim.Delay, faultsim.Spike, faultsim.Cut,
		faultsim.OneWay, faultsim.Split3, faultsim.Flap, faultsim.Pause, faultsim.Crash},
	MaxEvents: 10,
	Hot:       []int{0},
	Seeds:     faultsim.Range(1, 60),
	Count:     20,
}

// TestSimStore runs Limiters of four processes over one in-memory store
// whose calls go through the simulated network: calls and answers lost
// (an answer lost after the write), delayed past the caller's timeout,
// duplicated; the store paused, or restarted (with its state kept or, by
// the seed, lost); a process paused or restarted. It checks at every
// sample, for each key, that the units the processes were told were
// admitted in any interval of length T add up to at most burst + rate·T
// (plus rate times the call timeout, as an admission is counted when its
// call returns), and burst more for each restart of a store that loses
// its state; and that every Allow returns within its timeout.
func TestSimStore(t *testing.T) {
	faultsim.Run(t, storeSpec, newStoreWorld)
}

const (
	storeRate    = 100 // units per second
	storeBurst   = 20
	storeTimeout = 100 * time.Millisecond // of one Allow
)

type storeWorld struct {
	env     *faultsim.Env
	durable bool // the store keeps its state across a restart
	alg     tokenbucket.Algorithm
	procs   []*storeProc

	mu       sync.Mutex
	store    *storelimit.Memory // nil while the store is down
	losses   int                // restarts that lost the store's state
	admitted map[string]int
	floor    map[string]float64 // min over past samples of admitted − rate·t
}

// storeProc is one process sharing the store.
type storeProc struct {
	i      int
	stop   context.CancelFunc
	done   chan struct{}
	paused bool
}

func newStoreWorld(env *faultsim.Env) faultsim.World {
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(storeRate), storeBurst)
	if err != nil {
		env.T.Fatal(err)
	}
	w := &storeWorld{env: env, durable: env.Rand.IntN(2) == 0, alg: alg, store: new(storelimit.Memory),
		admitted: map[string]int{}, floor: map[string]float64{}}
	env.Describe(fmt.Sprintf("store durable across restarts: %v", w.durable))
	for i := 1; i < env.Spec.Procs; i++ {
		p := &storeProc{i: i}
		w.procs = append(w.procs, p)
		w.start(p)
	}
	return w
}

// start starts a new life of p: a new Limiter, its guesses lost.
func (w *storeWorld) start(p *storeProc) {
	l, err := storelimit.New(&simStore{w: w, proc: p.i}, w.alg)
	if err != nil {
		w.env.T.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p.stop, p.done = stop, make(chan struct{})
	r := rand.New(rand.NewPCG(w.env.Rand.Uint64(), uint64(p.i)))
	go w.load(ctx, p, l, r)
}

// load asks for units until ctx ends, by the schedule's load shape.
func (w *storeWorld) load(ctx context.Context, p *storeProc, l *storelimit.Limiter, r *rand.Rand) {
	defer close(p.done)
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
		key := "hot"
		if w.env.Sched.Load == faultsim.NewKeys {
			key = "k" + strconv.Itoa(n/50%8)
		}
		w.allow(ctx, l, key, 1+r.IntN(3))
	}
}

// allow asks l for n units of key and counts them when admitted.
func (w *storeWorld) allow(ctx context.Context, l *storelimit.Limiter, key string, n int) {
	cctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	var d throttle.Decision
	var err error
	w.env.Within("Limiter.Allow", storeTimeout+10*time.Millisecond, func() { d, err = l.Allow(cctx, key, n) })
	if err == nil && d.Allowed {
		w.mu.Lock()
		w.admitted[key] += n
		w.mu.Unlock()
	}
}

func (w *storeWorld) Apply(e faultsim.Event) {
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

func (w *storeWorld) End(e faultsim.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case e.From == 0 && e.Kind == faultsim.Crash && !w.durable:
		w.store, w.losses = new(storelimit.Memory), w.losses+1
	case e.From == 0:
	case e.Kind == faultsim.Pause:
		w.procs[e.From-1].paused = false
	case e.Kind == faultsim.Crash:
		w.start(w.procs[e.From-1])
	}
}

// Check: for each key, admitted(now) − admitted(t0) ≤ burst + rate·(now −
// t0 + timeout) for every earlier sample t0 (and 0), plus burst per lost
// store state.
func (w *storeWorld) Check(now time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	slack := float64(storeBurst) * float64(1+w.losses)
	for key, a := range w.admitted {
		v := float64(a) - storeRate*now.Seconds()
		f, ok := w.floor[key]
		if !ok {
			f = 0
		}
		if over := v - f - storeRate*storeTimeout.Seconds(); over > slack {
			return fmt.Errorf("admitted over the bucket: key %q: %d units admitted, %.1f more than burst %v + rate·T allow in some interval T up to now (store states lost: %d)",
				key, a, over-float64(storeBurst), storeBurst, w.losses)
		}
		w.floor[key] = min(f, v)
	}
	return nil
}

func (w *storeWorld) Close() {
	for _, p := range w.procs {
		p.stop()
		<-p.done
	}
}

// simStore is a process's storelimit.LoadingStore: each call is a request
// and an answer through the simulated network to the store's process; a
// call whose answer does not come before ctx ends fails (whether or not
// the store applied it).
type simStore struct {
	w    *storeWorld
	proc int
}

var _ storelimit.LoadingStore = (*simStore)(nil)

func (s *simStore) Load(ctx context.Context, key string, now int64) (int64, error) {
	st, _, err := s.call(ctx, func(m *storelimit.Memory) (int64, bool, error) {
		v, err := m.Load(ctx, key, now)
		return v, false, err
	})
	return st, err
}

func (s *simStore) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	_, ok, err := s.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	return ok, err
}

func (s *simStore) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	return s.call(ctx, func(m *storelimit.Memory) (int64, bool, error) {
		return m.CompareAndSwapLoad(context.Background(), key, old, next, now, expires)
	})
}

type storeAnswer struct {
	state int64
	ok    bool
	err   error
}

// call runs op at the store, on the network's goroutine when the request
// arrives, and waits for the answer.
func (s *simStore) call(ctx context.Context, op func(*storelimit.Memory) (int64, bool, error)) (int64, bool, error) {
	net := s.w.env.Net
	answers := make(chan storeAnswer, 2) // room for a duplicate's
	net.Send(s.proc, 0, func() {
		s.w.mu.Lock()
		m := s.w.store
		s.w.mu.Unlock()
		if m == nil {
			return
		}
		var a storeAnswer
		a.state, a.ok, a.err = op(m)
		net.Send(0, s.proc, func() {
			select {
			case answers <- a:
			default:
			}
		})
	})
	select {
	case a := <-answers:
		return a.state, a.ok, a.err
	case <-ctx.Done():
		return 0, false, fmt.Errorf("store call: %w", ctx.Err())
	}
}
