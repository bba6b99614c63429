package gossip

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
	"github.com/throttlekit/throttle/internal/simbound"
	"github.com/throttlekit/throttle/internal/simnet"
	"github.com/throttlekit/throttle/internal/subscribers"
)

// The gossip scenarios of the fault simulator: 3 and 5 nodes, each in its
// own process of the simulation, over an in-memory transport whose
// datagrams go through faultsim.Net, with or without a Membership that
// follows what the network lets through (as memberlist's probes would),
// under every fault kind, and clients on every node asking at 1.5x the
// rate per key and node. The invariants are simbound's, sampled from what
// the clients were told.

// Seeds that found defects (issue 38) on the code before their fixes,
// each with the minimal schedule the shrinker found (on 3 nodes, or on 5
// where said; the other size draws another schedule from the seed).
var (
	simOwnerSeeds = []uint64{
		17061566829666912142, // Split3 [[0] [1] [2]] for 2 s: each node owns every key (56 in 1 s against 48)
		16156407508480087671, // 5 nodes, Split3 [[0 2 3] [4] [1]] for 1.1 s: each side owns every key (52 against 49)
		13347824568040045486, // 5 nodes, two Cuts, [[3]] then [[0]] alone: the minority owns every key
		10720998874496332427, // with a membership, OneWay 1→0 for 4.9 s, every member reported alive: two owners (owner-split)
		14717134015838402775, // 5 nodes, with a membership, OneWay 1→2 for 2.9 s: likewise
		3845298962461668995,  // 5 nodes, Crash of n2 for 55 ms: the restarted owner hands out a fresh burst (restart-burst)
		11575138510874784593, // 5 nodes, Crash of n2 for 447 ms: likewise
		580155519181280366,   // 5 nodes, Crash of n1 for 2 s: its keys start full on their new owner
		6467393562742328373,  // Pauses of n2 and n0: their keys move and start full, and they resume as owners too
		11843555462438148869, // with a membership, Spike of 1.9 s on n0's links: the others move its keys (owner-split)
		13149255347128470171, // Crashes of n1 and n0, restarted 0.26 s apart, n1's clock ahead: n0 took n1 for a first start, n2 heard only in datagrams to its previous life (restart-burst: 11 against 10.0)
	}
	simA2ASeeds = []uint64{
		4571432710564860314,  // Crash of n2 for 72 ms: the restarted node re-admits a key its peers exhausted (17 against 10.6)
		15208132294874020303, // with a membership, Crash of n1 for 1.9 s: likewise (17 against 10.8)
		1112609458660407561,  // Crash of n1 for 2.3 s: likewise
		13927861456412416243, // with a membership, Crash of n2 for 1.5 s: likewise
		10055755834328081655, // with a membership, Crash of n0 for 345 ms in a delay Spike of 1.3 s on its links: the silence lifted the start gate (22 against 21.6)
		8769714016376817789,  // Crash of n0 for 1.1 s, then Split3 for 1.8 s: restarted alone, the silence lifted the start gate (22 against 20.6)
		16072413096036349524, // with a membership and the spend cap, Crash of n2 into a Split3: its membership reported no member, the silence lifted the gate (23 against 22.2)
		17270375070352781516, // Crashes of n1, n2 and n0 overlapping: every process down at once, the key's state lost (the checker's outage rule)
	}
)

// simSmall are the small limits the spend cap is also simulated at, each
// with the seeds that found a defect at it: a burst small against N and a
// round's refill, where a token of a node's quota is a large part of the
// bucket.
var simSmall = []simLimitOf{
	{rate: 5, burst: 10, seeds: []uint64{
		10671133039333277693, // no fault: after 2 s idle, each node weighed its peers' demand averaged over the idle rounds and took the tokens left for itself
		5793016339505179280,  // likewise
		9276889832786274348,  // 5 nodes: likewise
		10517504914608058308, // 5 nodes: likewise
	}},
	{rate: 8, burst: 6, seeds: []uint64{
		10220705282254109074, // no fault: likewise (12 in 400 ms against 11.2)
		4611093946558567318,  // Crash of n0, then a rate change: the checker took the new, lower limit's restart bound before any process applied it (40 against 28.7)
	}},
}

// simChangeSeeds are fixed seeds of the limit-change subtests. The
// first four fail when the limiter of a changed limit gets twice the
// burst the limit states (the uncapped bound asserted after a change, as
// before, let each through); the last found that a node that applied a
// new limit after another started its bucket of it full, having dropped
// the reports of it sent before (see capExtra).
var simChangeSeeds = []uint64{
	3112042136746691215,  // 3 nodes: 49 in [4.6 s, 6.8 s] against 47.5
	10162168846744864804, // 3 nodes: 28 in [8.3 s, 10.6 s] against 27.8
	3656118554772835420,  // 5 nodes: 30 in [13.1 s, 14.2 s] against 26.8
	7774128390938375958,  // 5 nodes: 57 in [10.2 s, 11.9 s] against 52.5
	14444943653284838672, // 3 nodes, a limit of burst 40 rolled out from 10.9 s: 70 in [10.74 s, 11.4 s] against 63.2
}

// simLimitOf is a limit a scenario starts at, with its fixed seeds.
type simLimitOf struct {
	rate, burst int // per second, and the bucket's size
	seeds       []uint64
}

// TestSimGossipAllToAll runs the all-to-all counters (Node.NewLimiter),
// with and without the spend cap and a Membership, under random fault
// schedules; with the spend cap also under limit changes alone, and at
// small limits.
func TestSimGossipAllToAll(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			faultsim.Run(t, simbound.Spec("GossipAllToAll", n, 16, simA2ASeeds, 30), func(env *faultsim.Env) faultsim.World {
				return newSimWorld(env, false, nil)
			})
		})
	}
	for _, n := range []int{3, 5} {
		// The spend cap across limit changes: no fault but the changes
		// (and duplicates), so that calm windows follow them.
		t.Run(fmt.Sprintf("n=%d/limit-changes", n), func(t *testing.T) {
			spec := simbound.Spec("GossipAllToAll", n, 16, simChangeSeeds, 8)
			spec.Kinds = []faultsim.Kind{faultsim.Config, faultsim.Duplicate}
			faultsim.Run(t, spec, func(env *faultsim.Env) faultsim.World {
				return newSimWorld(env, false, &simLimitOf{rate: simbound.Rate, burst: simbound.Burst})
			})
		})
	}
	for _, lim := range simSmall {
		for _, n := range []int{3, 5} {
			t.Run(fmt.Sprintf("n=%d/rate=%d/burst=%d", n, lim.rate, lim.burst), func(t *testing.T) {
				faultsim.Run(t, simbound.Spec("GossipAllToAll", n, 16, lim.seeds, 4), func(env *faultsim.Env) faultsim.World {
					return newSimWorld(env, false, &lim)
				})
			})
		}
	}
}

// TestSimGossipOwner runs owner routing (Node.NewOwnedLimiter), with and
// without a Membership, under random fault schedules.
func TestSimGossipOwner(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			faultsim.Run(t, simbound.Spec("GossipOwner", n, 16, simOwnerSeeds, 30), func(env *faultsim.Env) faultsim.World {
				return newSimWorld(env, true, nil)
			})
		})
	}
}

// simWorld is one run: the nodes, their clients, and what the clients
// were told.
type simWorld struct {
	env     *faultsim.Env
	n       int
	owned   bool
	members bool // a simulated Membership, else static peers
	capped  bool
	timeout time.Duration
	settle  time.Duration // after a fault, until the bound holds again
	simbound.Run
	capEps []simbound.Episode // the episodes, settled for the spend cap
	fabric *simnet.Fabric
	procs  []*simProc
	stop   chan struct{}
	wg     sync.WaitGroup
	viewMu sync.Mutex // held while the memberships change, so that checkOwners sees them settled

	mu      sync.Mutex  // guards the fields below
	limits  []*simLimit // every limit of the run, the one in force last
	counts  []int64     // admitted per key
	series  *simbound.Series
	denied  []time.Duration   // per key: the last denial anywhere by an ungated node (all-to-all)
	outage  time.Duration     // the last instant every process was down, -1 for none
	views   [][]simView       // [observer][member], with members
	restart []*simRestart     // per process: since its last restart
	ownDeny [][]time.Duration // [proc][key]: its last local denial as the key's owner
}

// simRestart is what a process admitted of each key since its restart,
// against the key's last denial before it.
type simRestart struct {
	life   int
	at     time.Duration
	off    time.Duration   // its clock's offset at the crash
	since  []time.Duration // per key: the denial the bound counts from, -1 for none
	admits []int64
}

// simView is what an observer's membership says of a member.
type simView struct {
	alive    bool
	inc      uint64
	badSince time.Duration
}

// newSimWorld starts a run of owner routing or all-to-all, at the
// simulation's limit, or at small (then with the spend cap).
func newSimWorld(env *faultsim.Env, owned bool, small *simLimitOf) *simWorld {
	n := env.Spec.Procs
	w := &simWorld{env: env, n: n, owned: owned, members: env.Rand.IntN(2) == 0, capped: !owned && env.Rand.IntN(2) == 0,
		timeout: DefaultForwardTimeout, stop: make(chan struct{})}
	rate, burst := simbound.Rate, simbound.Burst
	if small != nil {
		rate, burst, w.capped = small.rate, small.burst, true
	}
	w.limits = []*simLimit{newSimLimit(n, throttle.PerSecond(rate), burst, 0)}
	w.settle = 3 * simbound.Interval
	if owned {
		w.settle = 2*simbound.Interval + w.timeout + 100*time.Millisecond
	}
	peers := simbound.PeerChanges(env.Sched)
	w.Run = simbound.NewRunOf(env, peers, w.settle, 2*simbound.Interval+w.settle)
	// The spend cap's bound holds once every peer's reports of the last
	// rounds arrived and the demand they carry reflects the load again:
	// 10 intervals after a fault (1.07 s after a delay spike of 485 ms
	// ended, 5 nodes admitted 27 in 400 ms against 26).
	w.capEps = simbound.NewRunOf(env, peers, 10*simbound.Interval, 12*simbound.Interval).Eps
	w.counts = make([]int64, len(w.Keys))
	w.denied = make([]time.Duration, len(w.Keys))
	for i := range w.denied {
		w.denied[i] = -1
	}
	w.outage = -1
	w.series = simbound.NewSeries(w.Keys)
	w.series.Extra = w.capExtra
	w.restart = make([]*simRestart, n)
	for range n {
		d := make([]time.Duration, len(w.Keys))
		for i := range d {
			d[i] = -1
		}
		w.ownDeny = append(w.ownDeny, d)
	}
	var ids []string
	for i := range n {
		w.procs = append(w.procs, &simProc{w: w, i: i, id: simID(i)})
		ids = append(ids, simID(i))
	}
	w.fabric = simnet.New(env.Net, ids)
	if w.members {
		w.views = make([][]simView, n)
		for i := range n {
			w.views[i] = make([]simView, n)
			for j := range n {
				w.views[i][j] = simView{alive: true, inc: 1, badSince: -1}
			}
		}
	}
	for _, p := range w.procs {
		p.start()
	}
	if w.members {
		w.wg.Add(1)
		go w.watchMembers()
	}
	for _, p := range w.procs {
		for c := range 4 {
			rng := rand.New(rand.NewPCG(env.Rand.Uint64(), uint64(p.i*16+c)))
			w.wg.Add(1)
			go w.client(p, rng, 4)
		}
	}
	return w
}

func simID(i int) string { return fmt.Sprintf("n%d", i) }

// client asks keys on p, one of callers goroutines of p, at 1.5x the
// rate per key and node in all (the load's shape aside), until the run
// ends.
func (w *simWorld) client(p *simProc, rng *rand.Rand, callers int) {
	defer w.wg.Done()
	simbound.Drive(w.stop, w.env.Sched.Load, w.Keys, rng, 1.5*w.limits[0].p.Rate/float64(callers), w.env.Elapsed, p.ask)
}

// record counts one decision a caller of p (in its life) was told.
//
// A denial of a gated node (see Limiter.gated) does not say the key was
// exhausted: a node that restarted after every process was down (the
// cluster's state lost) starts gated too.
//
// Only decisions under the limit in force last (gen) count for the
// restart bound: a changed limit starts a new bucket.
func (w *simWorld) record(p *simProc, life, gen int, key string, admitted, local, gated bool) {
	k := w.KeyIdx[key]
	now := w.env.Elapsed()
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.restart[p.i]
	switch {
	case admitted:
		w.counts[k]++
		if l := w.limits[gen]; l.exact != nil {
			l.level(k, now).tokens--
		}
		if r != nil && r.life == life && gen == len(w.limits)-1 && (!w.owned || local) {
			r.admits[k]++
		}
	case gen != len(w.limits)-1, !w.owned && w.limits[gen].settling(now):
	case w.owned && local:
		w.ownDeny[p.i][k] = now
	case !w.owned && !gated:
		w.denied[k] = now
	}
}

// Apply starts a process-level fault, or changes a node's peers or the
// limit.
func (w *simWorld) Apply(e faultsim.Event) {
	switch {
	case simbound.RateChange(e):
		w.changeLimit(e)
		return
	case e.Kind == faultsim.Config:
		w.reconfigure(e)
		return
	}
	simbound.Fault(w.procs, e, false)
}

// reconfigure applies a Config event (simbound.ConfigPair) to static
// peers: node u leaves node v out of its peers, or takes it back.
func (w *simWorld) reconfigure(e faultsim.Event) {
	if w.members {
		return // the membership decides the peers (a daemon does not reload them either)
	}
	u, v := simbound.ConfigPair(e, w.n)
	p := w.procs[u]
	p.mu.Lock()
	node := p.node
	if p.left == nil {
		p.left, p.cfgOut = map[string]bool{}, map[string]bool{}
	}
	back := p.cfgOut[simID(v)]
	p.cfgOut[simID(v)], p.left[simID(v)] = !back, !back
	p.mu.Unlock()
	if node == nil {
		return
	}
	if back {
		node.Join(simID(v))
	} else {
		node.Leave(simID(v))
	}
}

// End ends a pause (resume) or a crash (restart with the state lost).
func (w *simWorld) End(e faultsim.Event) { simbound.Fault(w.procs, e, true) }

// Crash ends p's life, as a fault: its state is lost.
func (p *simProc) Crash() {
	w := p.w
	w.mu.Lock()
	p.crashAt, p.crashOff = w.env.Elapsed(), w.env.Clocks[p.i].Offset()
	w.mu.Unlock()
	if gen, ok := p.crash(); ok {
		w.onLimit(gen, -1)
	}
	for _, q := range w.procs {
		q.mu.Lock()
		down := q.down
		q.mu.Unlock()
		if !down {
			return
		}
	}
	w.mu.Lock()
	w.outage = w.env.Elapsed()
	w.mu.Unlock()
}

// Restart begins p's next life after a crash.
func (p *simProc) Restart() {
	p.start()
	p.w.restarted(p)
}

// restarted records p's restart: from now on, what it admits of a key
// exhausted before is bounded by simbound.Restart.
func (w *simWorld) restarted(p *simProc) {
	p.mu.Lock()
	life := p.life
	p.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.env.Elapsed()
	r := &simRestart{life: life, at: now, off: p.crashOff, since: make([]time.Duration, len(w.Keys)),
		admits: make([]int64, len(w.Keys))}
	for k := range w.Keys {
		if w.owned {
			r.since[k] = w.ownDeny[p.i][k]
			if r.since[k] > p.crashAt {
				r.since[k] = -1
			}
		} else if r.since[k] = w.denied[k]; r.since[k] <= w.outage {
			r.since[k] = -1 // every process was down since: the key's state is lost
		}
	}
	w.restart[p.i] = r
}

// Check samples what the clients were told: per key, every window since
// an earlier sample against the routing's bound, and what each restarted
// process admitted of keys exhausted before its restart.
func (w *simWorld) Check(now time.Duration) error {
	off := simbound.Offsets(w.env.Clocks)
	if err := w.checkOwners(); err != nil {
		return w.world(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.checkRestarts(now, off); err != nil {
		return err
	}
	counts := slices.Clone(w.counts)
	class := "a2a-bound"
	if w.owned {
		class = "owner-bound"
	}
	return w.world(w.series.Add(now, counts, off, class, w.Eps, w.bound))
}

// bound is the routing's bound of a window: the sum, over the limits in
// force in it, of each limit's bound over the part of the window it was
// in force (limits of different rates or bursts are different buckets:
// no usage carries over between them). Called with w.mu held.
func (w *simWorld) bound(win simbound.Window) float64 {
	b := 0.0
	for _, l := range w.limits {
		if l.from < 0 {
			continue // no process applied it yet
		}
		to := time.Duration(math.MaxInt64)
		if l.to >= 0 {
			to = l.to + w.settle // decisions under way when the last process left it
		}
		sub, ok := simbound.Sub(win, l.episodes(w.Eps, w.settle), l.from, to)
		switch {
		case !ok:
		case w.owned:
			b += simbound.Owner(l.p, sub)
		case w.capped && calm(simbound.At(w.capEps, sub.T0, sub.T, nil, nil)):
			// The spend cap holds each limit to its own bound over its
			// part of the window, but for what a process that applied
			// it within capGap after another may not know of (see
			// capExtra and the registry's gossip-cap row).
			b += simbound.Capped(l.p, sub)
		default:
			b += simbound.AllToAll(l.p, sub)
		}
	}
	return b
}

// calm reports whether no fault nor configuration change overlaps w.
func calm(w simbound.Window) bool { return w.Episodes == 0 && w.Configs == 0 }

// world appends the run's configuration to a violation.
func (w *simWorld) world(err error) error {
	if err == nil {
		return nil
	}
	limits := ""
	for _, l := range w.limits[1:] {
		limits += fmt.Sprintf(", limit %s from %v", l.name, l.from)
	}
	return fmt.Errorf("%w (%d nodes, membership %v, spend cap %v, load %v%s)", err, w.n, w.members, w.capped, w.env.Sched.Load, limits)
}

// checkOwners checks, with a membership, that every running node routes
// each key to the owner its membership's view gives (itself and the
// members it reports alive): a node's own silence rule must not move
// keys while the membership reports their owner alive, or a key has two
// owners (issue 38: a one-way loss).
func (w *simWorld) checkOwners() error {
	if !w.owned || !w.members {
		return nil
	}
	w.viewMu.Lock()
	defer w.viewMu.Unlock()
	for _, p := range w.procs {
		p.mu.Lock()
		own, ms, out := p.own, p.ms, p.down || p.paused
		p.mu.Unlock()
		if out || own == nil {
			continue
		}
		view := []string{p.id}
		p.mu.Lock()
		for _, m := range ms.Members() {
			if !p.left[m.ID] {
				view = append(view, m.ID)
			}
		}
		p.mu.Unlock()
		slices.Sort(view)
		for _, key := range w.Keys {
			if got, want := own.Owner(key), ownerOf(key, view); got != want {
				return fmt.Errorf("owner-split: %s routes key %q to %s, its membership reporting %v alive, whose owner is %s",
					p.id, key, got, view, want)
			}
		}
	}
	return nil
}

// checkRestarts checks what each restarted process admitted since its
// restart of the keys exhausted before it. Called with w.mu held.
//
// The admits counted are under the limit in force last (see record) once
// a process applied it; until then, under the one before, which the
// bound is then of (the new one may be lower).
func (w *simWorld) checkRestarts(now time.Duration, off []time.Duration) error {
	lim := w.limits[len(w.limits)-1]
	if lim.from < 0 && len(w.limits) > 1 {
		lim = w.limits[len(w.limits)-2]
	}
	for i, r := range w.restart {
		if r == nil {
			continue
		}
		for k, since := range r.since {
			if since < 0 || r.admits[k] == 0 {
				continue
			}
			d := now - since + max(0, off[i]-r.off)
			lag := time.Duration(0)
			if !w.owned {
				// The hits the others made that this node may not have
				// heard of: one lag, and the faults other than its crash
				// that delayed reports since the denial.
				lag = w.limits[0].p.Lag + w.otherFaults(i, since, now)
			}
			if b := simbound.Restart(lim.p, d, lag); float64(r.admits[k]) > b {
				return w.world(fmt.Errorf("restart-burst: n%d restarted at %v admitted %d of key %q by %v, exhausted (denied) at %v; bound %.1f",
					i, r.at, r.admits[k], w.Keys[k], now, since, b))
			}
		}
	}
	return nil
}

// otherFaults is how long, within [from, to], faults other than proc's
// own crashes were in force.
func (w *simWorld) otherFaults(proc int, from, to time.Duration) time.Duration {
	sched := faultsim.Schedule{}
	for _, e := range w.env.Sched.Events {
		if e.Kind != faultsim.Crash || e.From != proc {
			sched.Events = append(sched.Events, e)
		}
	}
	return simbound.At(simbound.Episodes(sched, to, 3*simbound.Interval), from, to, nil, nil).Overlap
}

// Close stops the clients, the membership and every node.
func (w *simWorld) Close() {
	close(w.stop)
	w.wg.Wait()
	for _, p := range w.procs {
		p.crash()
	}
}

// simProc is one process: a node in its current life.
type simProc struct {
	w  *simWorld
	i  int
	id string

	crashAt  time.Duration // guarded by w.mu
	crashOff time.Duration // guarded by w.mu

	inc atomic.Uint64 // its life, as its membership tells

	mu     sync.Mutex // guards the fields below
	life   int
	gen    int // the limit lim or own decides: w.limits[gen]
	node   *Node
	lim    *Limiter
	own    *OwnedLimiter
	lims   map[string]*Limiter // by name: this life's limiters, of every limit it had
	owns   map[string]*OwnedLimiter
	ms     *simMembership
	paused bool
	down   bool
	left   map[string]bool // peers this life left out (Config), until its membership brings them back
	cfgOut map[string]bool // peers this life's configuration leaves out
	halt   chan struct{}   // stops the life's round timer
	ticker sync.WaitGroup
}

// start begins a new life of p: a new node, its limiter and its round
// timer.
func (p *simProc) start() {
	w := p.w
	p.mu.Lock()
	defer p.mu.Unlock()
	p.life++
	p.inc.Store(uint64(p.life))
	p.left, p.cfgOut = nil, nil
	cfg := Config{Transport: w.fabric.Endpoint(p.i), Secret: secret, Interval: simbound.Interval, SpendCap: w.capped}
	if w.members {
		p.ms = newSimMembership(Member{ID: p.id, Incarnation: uint64(p.life)}, w.initialMembers(p.i))
		cfg.Membership = p.ms
	} else {
		for j := range w.n {
			if j != p.i {
				cfg.Peers = append(cfg.Peers, simID(j))
			}
		}
		cfg.ID = p.id
	}
	node, err := NewNode(cfg, throttle.WithClock(w.env.Clocks[p.i]))
	if err != nil {
		w.env.Violate(fmt.Errorf("setup: %v", err))
		return
	}
	p.node, p.down, p.lims, p.owns = node, false, nil, nil
	p.gen = w.onLimit(-1, 1) // the limit in force now
	p.setLimit(w.limit(p.gen))
	p.halt = make(chan struct{})
	p.ticker.Add(1)
	go p.rounds(node, p.halt)
}

// rounds runs the node's rounds at every boundary of its clock, but while
// the process is paused, until halt.
func (p *simProc) rounds(node *Node, halt chan struct{}) {
	defer p.ticker.Done()
	clk := p.w.env.Clocks[p.i]
	iv := int64(simbound.Interval)
	for {
		now := clk.Now().UnixNano()
		wait := time.Duration((now/iv+1)*iv-now) + time.Millisecond/4
		select {
		case <-halt:
			return
		case <-time.After(wait):
		}
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if !paused {
			node.Tick()
		}
	}
}

// SetPaused pauses or resumes p: no rounds, no asks while paused.
func (p *simProc) SetPaused(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
}

// crash ends p's life: its node is closed, its state lost. It returns
// the limit p was on, if it was running.
func (p *simProc) crash() (gen int, ok bool) {
	p.mu.Lock()
	if p.down || p.node == nil {
		p.mu.Unlock()
		return 0, false
	}
	p.down = true
	close(p.halt)
	node, gen := p.node, p.gen
	p.mu.Unlock()
	p.ticker.Wait()
	node.Close()
	return gen, true
}

// ask makes one decision of key on p, as a client of p would, unless p is
// down or paused, and records what the client was told.
func (p *simProc) ask(key string) {
	p.mu.Lock()
	if p.down || p.paused {
		p.mu.Unlock()
		return
	}
	life, gen, lim, own := p.life, p.gen, p.lim, p.own
	p.mu.Unlock()
	w := p.w
	var d throttle.Decision
	var err error
	local, gated := false, false
	limit := 5 * time.Millisecond
	if own != nil {
		limit = w.timeout + 5*time.Millisecond
	}
	w.env.Within(fmt.Sprintf("n%d Allow(%q)", p.i, key), limit, func() {
		if own != nil {
			local = own.Owner(key) == p.id
			d, err = own.Allow(context.Background(), key, 1)
		} else {
			d, err = lim.Allow(context.Background(), key, 1)
			// A gated node's denial, or the spend cap's while the
			// bucket holds tokens (this node's share is spent), does
			// not say the key was exhausted.
			gated = lim.node.gated.Load() || (!d.Allowed && lim.Tokens(key) > 0)
		}
	})
	if err != nil {
		return // closed by a crash meanwhile
	}
	w.record(p, life, gen, key, d.Allowed, local, gated)

}

// simMembership is a Membership whose view the world sets, as a failure
// detector would report it.
type simMembership struct {
	local Member
	mu    sync.Mutex
	alive map[string]Member
	subs  subscribers.List[MemberEvent]
}

func newSimMembership(local Member, alive []Member) *simMembership {
	m := &simMembership{local: local, alive: map[string]Member{}}
	for _, a := range alive {
		m.alive[a.ID] = a
	}
	return m
}

func (m *simMembership) Local() Member { return m.local }

func (m *simMembership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ms []Member
	for _, a := range m.alive {
		ms = append(ms, a)
	}
	slices.SortFunc(ms, func(a, b Member) int { return cmpString(a.ID, b.ID) })
	return ms
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *simMembership) Subscribe(f func(MemberEvent)) (stop func()) { return m.subs.Subscribe(f) }

func (m *simMembership) emit(e MemberEvent) {
	m.mu.Lock()
	if e.Kind == MemberJoin {
		m.alive[e.Member.ID] = e.Member
	} else {
		delete(m.alive, e.Member.ID)
	}
	m.mu.Unlock()
	m.subs.Emit(e)
}

// simSuspect is how long a member stays unreachable before the simulated
// failure detector declares it dead.
const simSuspect = time.Second

// reach reports whether observer i's failure detector reaches j now:
// directly both ways, or through a third member (an indirect probe).
func (w *simWorld) reach(i, j int) bool {
	net := w.env.Net
	both := func(a, b int) bool { return net.Reachable(a, b) && net.Reachable(b, a) }
	if both(i, j) {
		return true
	}
	for k := range w.n {
		if k != i && k != j && both(i, k) && both(k, j) {
			return true
		}
	}
	return false
}

// initialMembers is what a starting life of process i learns from its
// seeds: the members it reaches now, and their lives. Called with i's
// mutex held (not another's).
func (w *simWorld) initialMembers(i int) []Member {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ms []Member
	for j := range w.n {
		if j == i {
			continue
		}
		v := &w.views[i][j]
		v.alive, v.badSince, v.inc = w.reach(i, j), -1, w.procs[j].inc.Load()
		if v.alive {
			ms = append(ms, Member{ID: simID(j), Incarnation: v.inc})
		}
	}
	return ms
}

// watchMembers updates every process's membership every 100 ms from what
// the network lets through: a member unreachable for simSuspect is dead,
// one reachable again (or in a new life) joins.
func (w *simWorld) watchMembers() {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		now := w.env.Elapsed()
		w.viewMu.Lock()
		for i, p := range w.procs {
			p.mu.Lock()
			ms, out := p.ms, p.down || p.paused
			p.mu.Unlock()
			if out || ms == nil {
				continue
			}
			for _, e := range w.viewChanges(i, now) {
				if e.Kind == MemberJoin {
					p.mu.Lock()
					delete(p.left, e.Member.ID) // a join brings a peer left out back
					p.mu.Unlock()
				}
				ms.emit(e)
			}
		}
		w.viewMu.Unlock()
	}
}

// viewChanges updates observer i's view at now and returns the events.
func (w *simWorld) viewChanges(i int, now time.Duration) []MemberEvent {
	var evs []MemberEvent
	for j := range w.n {
		if j == i {
			continue
		}
		reach, inc := w.reach(i, j), w.procs[j].inc.Load()
		w.mu.Lock()
		v := &w.views[i][j]
		switch {
		case reach:
			v.badSince = -1
			if !v.alive || v.inc != inc {
				v.alive, v.inc = true, inc
				evs = append(evs, MemberEvent{Kind: MemberJoin, Member: Member{ID: simID(j), Incarnation: inc}})
			}
		case v.badSince < 0:
			v.badSince = now
		case v.alive && now-v.badSince >= simSuspect:
			v.alive = false
			evs = append(evs, MemberEvent{Kind: MemberDead, Member: Member{ID: simID(j), Incarnation: v.inc}})
		}
		w.mu.Unlock()
	}
	return evs
}

// simLimit is one limit of a run: its rate and burst, under the name a
// daemon gives it (a reload that changes a limit makes a new limiter of a
// new name, as the daemon's and the rules' reloads do), in force on the
// processes that applied it until they apply the next.
type simLimit struct {
	p     simbound.Params
	rate  throttle.Rate
	burst int
	name  string
	from  time.Duration // when the first process applied it; -1 before
	all   time.Duration // when every running process had, -1 before
	to    time.Duration // when no running process was on it any more (a later one in force), -1 before
	procs int           // running processes on it
	// applied is when each process applied it (a restarted one again),
	// in time order, and the tokens of the exact bucket of each key then.
	applied []simApply
	exact   []simExact // per key: a bucket of the limit charged every admission under it
}

// simApply is a process applying a limit: when, and the tokens of each
// key's exact bucket then (0 to burst).
type simApply struct {
	at     time.Duration
	tokens []float64
}

// simExact is one key's exact bucket of a limit: what one bucket charged
// with every admission anywhere would hold.
type simExact struct {
	tokens float64
	at     time.Duration
}

// level returns the tokens of key k's exact bucket of l at now, brought
// up to now; a key not asked yet is full.
func (l *simLimit) level(k int, now time.Duration) *simExact {
	e := &l.exact[k]
	if e.at < l.from {
		e.tokens, e.at = float64(l.burst), l.from
	}
	e.tokens = min(float64(l.burst), e.tokens+l.p.Rate*(now-e.at).Seconds())
	e.at = now
	return e
}

func newSimLimit(n int, rate throttle.Rate, burst int, from time.Duration) *simLimit {
	perSec := float64(rate.Count()) / rate.Period().Seconds()
	return &simLimit{p: simbound.Params{N: n, Rate: perSec, Burst: burst, Lag: simbound.Interval + 20*time.Millisecond},
		rate: rate, burst: burst, name: fmt.Sprintf("api|%v|%d", rate, burst), from: from, all: from, to: -1}
}

// episodes returns eps and, for a limit that replaced another, the
// change as an episode from the first process that applied it until every
// running process had, settle more: meanwhile the processes on it ask
// owners, or report hits to peers, that do not have it yet.
func (l *simLimit) episodes(eps []simbound.Episode, settle time.Duration) []simbound.Episode {
	if l.from <= 0 {
		return eps
	}
	to := time.Duration(math.MaxInt64 / 2)
	if l.all >= 0 {
		to = l.all + settle
	}
	return append(slices.Clip(eps), simbound.Episode{Kind: simbound.Reload, From: l.from, To: to, Count: 1})
}

// simLimits are the limits a rate change picks from: rates of 2.5, 5 and
// 10 a second by bursts of 10, 20 and 40.
var simLimits = func() (ls [][2]int) {
	for _, r := range []int{5, 10, 20} { // per 2 s
		for _, b := range []int{10, 20, 40} {
			ls = append(ls, [2]int{r, b})
		}
	}
	return ls
}()

// changeLimit applies a rate change (simbound.RateChange): a new rate and
// burst, drawn from e, applied by every process one after the other
// within a second, as a configuration pushed to each, and by every
// process that starts from then on. A process whose turn comes after a
// later change applies that one.
func (w *simWorld) changeLimit(e faultsim.Event) {
	w.mu.Lock()
	cur := w.limits[len(w.limits)-1]
	i := int(e.Value % uint64(len(simLimits)))
	for pick := simLimits[i]; int64(pick[0]) == cur.rate.Count() && pick[1] == cur.burst; pick = simLimits[i] {
		i = (i + 1) % len(simLimits)
	}
	l := newSimLimit(w.n, throttle.NewRate(simLimits[i][0], 2*time.Second), simLimits[i][1], -1)
	l.all = -1
	w.limits = append(w.limits, l)
	gen := len(w.limits) - 1
	w.mu.Unlock()
	rng := rand.New(rand.NewPCG(e.Value, 0x5a))
	for _, p := range w.procs {
		after := time.Duration(rng.Int64N(int64(time.Second)))
		w.wg.Go(func() {
			select {
			case <-w.stop:
			case <-time.After(after):
				p.reload(gen)
			}
		})
	}
}

// reload makes p decide on limit gen, unless it is down (it starts on the
// limit in force) or on gen or a later one already. The limiters of the
// limits it leaves stay open: they answer the asks of processes that have
// not changed yet, and take their reports.
func (p *simProc) reload(gen int) {
	w := p.w
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down || p.gen >= gen {
		return
	}
	w.onLimit(p.gen, -1)
	p.gen = w.onLimit(-1, 1)
	p.setLimit(w.limit(p.gen))
}

// setLimit gives p's node a limiter of l, or takes the one it has. Called
// with p.mu held.
func (p *simProc) setLimit(l simLimit) {
	var err error
	if p.lims == nil {
		p.lims, p.owns = map[string]*Limiter{}, map[string]*OwnedLimiter{}
	}
	switch {
	case p.w.owned && p.owns[l.name] != nil:
		p.own = p.owns[l.name]
	case p.w.owned:
		p.own, err = p.node.NewOwnedLimiter(l.name, l.rate, l.burst)
		p.owns[l.name] = p.own
	case p.lims[l.name] != nil:
		p.lim = p.lims[l.name]
	default:
		p.lim, err = p.node.NewLimiter(l.name, l.rate, l.burst)
		p.lims[l.name] = p.lim
	}
	if err != nil {
		p.w.env.Violate(fmt.Errorf("setup: %v", err))
	}
}

// limit returns a copy of limit gen.
func (w *simWorld) limit(gen int) simLimit {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.limits[gen]
}

// onLimit counts a running process more (d = 1) or less (-1) on limit gen
// (-1: the one in force, which it returns), and records when a limit
// reached every running process or lost its last.
func (w *simWorld) onLimit(gen, d int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := len(w.limits) - 1
	if gen < 0 {
		gen = last
	}
	now := w.env.Elapsed()
	l := w.limits[gen]
	l.procs += d
	if l.from < 0 {
		l.from = now
		w.newLimit()
	}
	if d > 0 {
		if l.exact == nil {
			l.exact = make([]simExact, len(w.Keys))
		}
		a := simApply{at: now, tokens: make([]float64, len(w.Keys))}
		for k := range a.tokens {
			a.tokens[k] = max(l.level(k, now).tokens, 0)
		}
		l.applied = append(l.applied, a)
	}
	if gen < last && l.procs == 0 && l.to < 0 {
		l.to = now
	}
	running := 0
	for _, x := range w.limits {
		running += x.procs
	}
	if cur := w.limits[last]; cur.all < 0 && cur.procs == running {
		cur.all = now
	}
	return gen
}

// capSettle is how long after a process applied l within capGap after
// another the spend cap's bound of l allows what the earlier one took
// meanwhile (see capExtra): the 10 intervals a fault takes to settle.
func (l *simLimit) capSettle() time.Duration { return 10 * simbound.Interval }

// settling reports whether, at now, l replaced another limit less than a
// refill time (burst/rate) after every running process had it, or not all
// have it yet. Meanwhile the all-to-all counters do not say that a key
// denied on one node is exhausted on the others: a node that applied the
// limit within a round after another started its bucket without that
// one's hits, and the reports of it kept for a node are bounded (see
// Node.NewLimiter).
func (l *simLimit) settling(now time.Duration) bool {
	refill := time.Duration(float64(l.burst) / l.p.Rate * float64(time.Second))
	return l.from > 0 && (l.all < 0 || now < l.all+refill)
}

// newLimit forgets the denials a restarted process's bound counts from:
// a new limit is a new bucket. Called with w.mu held.
func (w *simWorld) newLimit() {
	for _, r := range w.restart {
		if r != nil {
			for k := range r.since {
				r.since[k] = -1
			}
		}
	}
	for k := range w.denied {
		w.denied[k] = -1
	}
	for _, d := range w.ownDeny {
		for k := range d {
			d[k] = -1
		}
	}
}

// capExtra is what the spend cap's bound of window win allows key k on
// top (see Series.Extra): for each two processes that applied a new limit
// within capGap of each other, what the earlier one may have admitted
// before its first report of the limit reached the later one, which
// decides meanwhile on a bucket without it: at most what the key's exact
// bucket held when the earlier one applied the limit, and its refill
// until then. A process that applies the limit later has every report
// of it sent before (a node keeps what its peers report for a limiter it
// does not have yet, and charges it when it creates it): nothing on top.
// Called with w.mu held.
func (w *simWorld) capExtra(win simbound.Window, k int) float64 {
	if !w.capped {
		return 0
	}
	extra := 0.0
	for _, l := range w.limits {
		for i := 0; l.from > 0 && i < len(l.applied); i++ {
			a := l.applied[i]
			for _, b := range l.applied[i+1:] {
				if b.at-a.at >= capGap {
					break
				}
				if win.T0 < b.at+l.capSettle() && win.T > a.at {
					extra += min(float64(l.burst), a.tokens[k]+l.p.Rate*(b.at-a.at+capGap).Seconds())
				}
			}
		}
	}
	return extra
}

// capGap is how long after a process applied a limit another may apply it
// before the first one's first report of it could have reached it: a
// round and the simulation's delay.
const capGap = simbound.Interval + 20*time.Millisecond
