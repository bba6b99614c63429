package envoyrls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/faultsim"
	"github.com/throttlekit/throttle/internal/simbound"
	"github.com/throttlekit/throttle/internal/simnet"
)

// The gossip backend under message loss and partitions, through the RLS
// API: three services, each on its own gossip node over the simulator's
// fabric, Envoy-style clients on every node asking about two descriptors
// per request at 1.5x their rates, and the registry's bound of the
// routing checked per descriptor from what the clients were told (the
// status of each descriptor), every sample.

// simRLSConfig has two rules of other units, so other gossip limiters,
// asked in every request: each descriptor is checked against its own
// bound. The first has the burst of the gossip package's own simulation,
// 20 at 5/s; the second a burst of 10 at 5/s, small against the nodes and
// the interval's refill, where the spend cap once weighed peers by their
// demand averaged over idle rounds (26 of 150 seeds over the bound, up to
// 17 in 400 ms against 14.0).
const simRLSConfig = `
domain: sim
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 300, algorithm: token_bucket, burst: 10}
`

// simRLSRules are the rules of simRLSConfig as the bounds see them.
var simRLSRules = [2]struct {
	key   string
	rate  float64
	burst int
}{{"k", 5, 20}, {"m", 5, 10}}

const simRLSInterval = 200 * time.Millisecond

// TestSimRLSGossip runs the gossip backend, all-to-all with the spend cap
// and owner routing, on 3 nodes under random schedules of loss, two-way
// and three-way partitions.
func TestSimRLSGossip(t *testing.T) {
	for _, owned := range []bool{false, true} {
		t.Run(map[bool]string{false: "all-to-all", true: "owner"}[owned], func(t *testing.T) {
			spec := faultsim.Spec{Name: "RLSGossip", Procs: 3, Len: 20 * time.Second, Sample: 100 * time.Millisecond,
				Kinds: []faultsim.Kind{faultsim.Loss, faultsim.Cut, faultsim.Split3}, MaxEvents: 8, Count: 12}
			faultsim.Run(t, spec, func(env *faultsim.Env) faultsim.World { return newRLSWorld(env, owned) })
		})
	}
}

// rlsWorld is one run: the nodes, their services, and what each
// descriptor's clients were told.
type rlsWorld struct {
	env    *faultsim.Env
	owned  bool
	params [2]simbound.Params
	simbound.Run
	capEps []simbound.Episode // the episodes, settled for the spend cap
	nodes  []*gossip.Node
	fleets []*Fleet
	svcs   []*Service
	stop   chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex // guards the fields below
	counts [2][]int64 // per rule, per key: descriptors answered OK
	series [2]*simbound.Series
}

func newRLSWorld(env *faultsim.Env, owned bool) *rlsWorld {
	settle := 3 * simRLSInterval
	if owned {
		settle = 2*simRLSInterval + gossip.DefaultForwardTimeout + 100*time.Millisecond
	}
	w := &rlsWorld{env: env, owned: owned, stop: make(chan struct{}),
		Run:    simbound.NewRun(env, settle, 2*simRLSInterval+settle),
		capEps: simbound.NewRun(env, 10*simRLSInterval, 12*simRLSInterval).Eps}
	for i, r := range simRLSRules {
		w.params[i] = simbound.Params{N: 3, Rate: r.rate, Burst: r.burst, Lag: simRLSInterval + 20*time.Millisecond}
		w.counts[i] = make([]int64, len(w.Keys))
		w.series[i] = simbound.NewSeries(w.Keys)
	}
	ids := []string{"n0", "n1", "n2"}
	fabric := simnet.New(env.Net, ids)
	cfg := mustParse(env.T, "sim.yaml", simRLSConfig)
	for i, id := range ids {
		peers := slices.Delete(slices.Clone(ids), i, i+1)
		node, err := gossip.NewNode(gossip.Config{Transport: fabric.Endpoint(i), Secret: []byte("0123456789abcdef0123"),
			ID: id, Peers: peers, Interval: simRLSInterval, SpendCap: !owned}, throttle.WithClock(env.Clocks[i]))
		if err != nil {
			env.T.Fatal(err)
		}
		f := NewFleet(node, FleetOptions{Owner: owned})
		w.nodes, w.fleets = append(w.nodes, node), append(w.fleets, f)
		w.svcs = append(w.svcs, newService(cfg, Options{Backend: f, Now: env.Clocks[i].Now}))
		w.wg.Go(func() { w.rounds(i) })
	}
	for i := range w.svcs {
		for c := range 4 {
			rng := rand.New(rand.NewPCG(env.Rand.Uint64(), uint64(i*16+c)))
			w.wg.Go(func() {
				simbound.Drive(w.stop, env.Sched.Load, w.Keys, rng, 1.5*simRLSRules[1].rate/4, env.Elapsed,
					func(key string) { w.ask(i, key) })
			})
		}
	}
	return w
}

// rounds runs node i's gossip rounds at every boundary of its clock.
func (w *rlsWorld) rounds(i int) {
	clk, iv := w.env.Clocks[i], int64(simRLSInterval)
	for {
		now := clk.Now().UnixNano()
		select {
		case <-w.stop:
			return
		case <-time.After(time.Duration((now/iv+1)*iv-now) + time.Millisecond/4):
		}
		w.nodes[i].Tick()
	}
}

// ask sends one request of both descriptors to service i, as Envoy
// would, checks it returns in time, and records each descriptor's code.
func (w *rlsWorld) ask(i int, key string) {
	start := w.env.Elapsed()
	resp, err := w.svcs[i].ShouldRateLimit(context.Background(), req("sim", desc("k", key), desc("m", key)))
	if err != nil {
		w.env.Violate(fmt.Errorf("rls-error: node %d: %v", i, err))
		return
	}
	limit := 5 * time.Millisecond
	if w.owned { // one forward per descriptor at most
		limit += 2 * gossip.DefaultForwardTimeout
	}
	if took := w.env.Elapsed() - start; took > limit {
		w.env.Violate(fmt.Errorf("rls-slow: node %d answered in %v, want at most %v", i, took, limit))
	}
	k := w.KeyIdx[key]
	w.mu.Lock()
	defer w.mu.Unlock()
	for r, st := range resp.Statuses {
		if st.Code == rlsv3.RateLimitResponse_OK {
			w.counts[r][k]++
		}
	}
}

// Check compares, per descriptor, what its clients were told OK in every
// window with the registry's bound of the routing.
func (w *rlsWorld) Check(now time.Duration) error {
	off := simbound.Offsets(w.env.Clocks)
	w.mu.Lock()
	defer w.mu.Unlock()
	for r, rule := range simRLSRules {
		p, counts := w.params[r], slices.Clone(w.counts[r])
		var err error
		if w.owned {
			err = w.series[r].Add(now, counts, off, "owner-bound", w.Eps, func(win simbound.Window) float64 {
				return simbound.Owner(p, win)
			})
		} else {
			err = w.series[r].Add(now, counts, off, "a2a-bound", w.Eps, func(win simbound.Window) float64 {
				if c := simbound.At(w.capEps, win.T0, win.T, nil, nil); c.Episodes == 0 {
					return simbound.Capped(p, win)
				}
				return simbound.AllToAll(p, win)
			})
		}
		if err != nil {
			return fmt.Errorf("%w (descriptor %q, load %v)", err, rule.key, w.env.Sched.Load)
		}
	}
	return nil
}

// Apply and End have nothing to do: the faults are the fabric's.
func (w *rlsWorld) Apply(faultsim.Event) {}
func (w *rlsWorld) End(faultsim.Event)   {}

// Close stops the clients and the rounds, then the services' backends
// and the nodes.
func (w *rlsWorld) Close() {
	close(w.stop)
	w.wg.Wait()
	for i, n := range w.nodes {
		w.fleets[i].Close()
		n.Close()
	}
}
