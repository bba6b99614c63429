package capacity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/faultsim"
)

// simSpec is capacity's fault simulation: nine processes whose roles
// depend on the seed's topology (one server, two replicas with an
// election, or a root with two leaves), the others clients.
var simSpec = faultsim.Spec{
	Name:   "Capacity",
	Procs:  9,
	Len:    40 * time.Second,
	Sample: 25 * time.Millisecond,
	// Every kind: a clock step moves a process's wall clock, which
	// capacity does not read (leases run on monotonic time), so the
	// servers get the clocks' monotonic view: skewed, never stepped.
	Kinds:     faultsim.AllKinds(),
	MaxEvents: 12,
	Hot:       []int{0, 1, 2},
	Seeds:     append(simDefectSeeds, faultsim.Range(1, 200)...),
	// A few random seeds in every run, printed for replay, so that CI
	// explores; the long mode (THROTTLE_SIM_SEEDS) runs many more.
	Count: 30,
}

// simDefectSeeds are the seeds that found defects, from random seeds
// alone; each fails on the code before its fix. Replay one with
// THROTTLE_SIM_SEED=S (THROTTLE_SIM_TRACE=1 logs every call).
var simDefectSeeds = []uint64{
	// A gauge client reported its lease, not the units it held: 127 of
	// 120 units in flight at one server, with no fault at all.
	3015048007949149169,
	// A restarted tree leaf let the root over-grant: the leaf's first
	// report after a crash of 279ms (and of 169ms in the second seed)
	// confirmed its lowered lease; Σ 13 of 12 and 16 of 12. (The second
	// also finds the gauge defect in a tree below.)
	17479477297254288466, 14625525414414217414,
	// A leaf that gave a resource up while cut off from its clients
	// retries the release after the partition heals, with a new sequence
	// number: it frees the lease the leaf has taken again since, which
	// its clients keep using; Σ 132 of 120 and 16 of 10.
	9881197673380654550, 15341542327155105696,
	// Gauge units in a tree: a leaf reported less than its clients hold
	// once their wants dropped below the units they hold, with no fault:
	// 11.5 of 10, 127 of 120; and, through a lossy link from the root to
	// a leaf (the third seed), 12.5 of 10.
	14603561293364919289, 4742803589254876298, 13212417863010102307,
	// A server learning after a restart confirms as a lease the units a
	// gauge client kept past its lease's expiry (paused 5.3s) while the
	// others have not reported theirs yet: leases of 181 of 180.
	6839967670367348011,
	// A gauge client lowered its count of carried units (kept past every
	// count of their lease, left out of its reports) only when it
	// reported: carried units released and fresh ones taken between two
	// reports stayed left out, and the server gave them to others. One
	// server: 12.07 of 12 after two three-way splits, 12.31 of 12 after a
	// delay spike and a pause, 10.26 of 10 after a crash, a one-way loss
	// and a spike; elected replicas: 5.17 of 5 after splits and capacity
	// changes, and 6.5 of 6 under clock skew (7 of 6 with the checker
	// telling units apart).
	7722002030246415504, 16056074627186002327, 12935397309016552689,
	17998981960965901653, 11364833552874060994,
	// A gauge client cut off past its lease, then granted 0 by the server
	// (the others held everything), reported again the units it kept past
	// the lapsed lease; a restarted server, learning, confirmed them as a
	// lease: 120.43 of 120 (a crash of the server in a flapping
	// partition).
	7171889218180800233,
	// Found with the tree's gauge bound asserted, failing a checker that
	// sampled when leases lapsed: a leaf's lease at the root lapsed and
	// was renewed within one sample (a lossy link to the root: 13 of 12);
	// a leaf crashed and, restarted, renewed its clients' leases at 0
	// while the chain of leases their units were taken under had ended
	// (14 of 12). Units kept past a chain's end come on top by design;
	// the checker now knows each lapse and each crashed leaf's end.
	4540042853062845012, 10340494035209870799,
	// A master whose clock ran 3.7 % fast dropped a gauge client's lease
	// before the client's own clock ended it; the client, back in that
	// gap, was no longer counted for the units it held under it, which
	// the master gave to others: 130 of 120 for 400ms (elected
	// replicas, a cut). A lease now counts at its server for 5 % of its
	// length past its expiry.
	15517272843379323261,
	// A tree leaf dropped a resource its clients had left and took it
	// again in the same call: the release of its lease at the root,
	// stamped only when its goroutine ran, came after the new lease's
	// first refresh and freed it while the leaf handed it out; Σ
	// enforced 180 of 120, with no fault.
	10014620103331538355,
	// A leaf's release of a resource its clients had left, sent in the
	// background to a root cut off by a split, outlived the leaf's Close
	// (a goroutine left blocked at the end of the run; 1 run in 2).
	13298106833636414539,
	// The checker's, not the code's: a leaf crashed twice 1.26s apart.
	// Its clients kept 6 gauge units taken under its first life's
	// leases, whose lease at the root ended at 13.06s; the checker ended
	// every crashed life's chain at the latest of their leases at the
	// root, its second life's (of 0, to 14.6s), and counted them when the
	// root gave that capacity to the other leaf: 11.33 of 10 at 13.275s.
	// Each unit now ends with the chain of the life that granted it.
	10163778234372213914,
}

// TestSimCapacity runs capacity's Servers, Clients, trees and elections
// under random fault schedules and checks, every 25ms of virtual time and
// after every fault, from the clients' side: the capacity they enforce
// on each resource (a rate client's limit; a gauge client's larger of its
// limit and the units it holds, but for those it kept past the end of its
// chain of leases, in a tree the lease at the root of the leaf life that
// granted it too, or held when the capacity dropped) adds up to no more
// than the largest capacity configured within the last lease length, in
// every topology; and every call returns within its stated time.
func TestSimCapacity(t *testing.T) {
	faultsim.Run(t, simSpec, newCapWorld)
	keptStats.Lock()
	for topo, worst := range keptStats.worst {
		if worst > 1 {
			t.Logf("%s: with the gauge units kept past a lease, which the bound leaves out, at most %.3f× the bound", topoNames[topo], worst)
		}
	}
	keptStats.Unlock()
	skewStats.Lock()
	defer skewStats.Unlock()
	if skewStats.episodes > 0 {
		t.Logf("under clock skew up to ±%.1f%%: %d samples over the bound, at most %.3f× it, episodes up to %v",
			100*skewStats.worstSkew, skewStats.episodes, skewStats.worst, skewStats.longest)
	}
}

// Topologies of the simulation.
const (
	topoSingle   = iota // p0 serves p1..p8
	topoElection        // p0 and p1 elect a master; p2..p8 are clients
	topoTree            // p0 is the root, p1 and p2 leaves, p3..p8 clients of a leaf each
	numTopos
)

var topoNames = [numTopos]string{"single server", "two replicas with an election", "tree: root and two leaves"}

// Roles of a process.
const (
	roleServer = iota // a server without a parent: the single one, a replica, the root
	roleLeaf
	roleClient
)

// capWorld is one run of the simulation.
type capWorld struct {
	env   *faultsim.Env
	topo  int
	cfg   Config // of the servers without a parent; the leaves' is the same template
	lease time.Duration
	ids   []string // the resources the load uses
	elect *simElection
	procs []*capProc
	// tracing (THROTTLE_SIM_TRACE=1) logs every call and, every 250ms,
	// what the clients enforce and the servers have.
	tracing bool

	mu      sync.Mutex
	history []capChange                  // the capacities configured, in order
	skew    float64                      // the largest clock rate skew of a server so far
	over    map[string]time.Duration     // since when a resource's sum is over its bound
	units   map[*GaugeResource]*unitBook // the units each gauge holds: when and under whose lease taken
	lives   map[*Server]*leafLife        // the incarnations of the tree's leaves
}

// leafLife is one incarnation of a tree leaf: when it started and
// crashed (zero while it runs) and, per resource, when its lease at the
// root last lapsed before the crash and when the chain of leases it
// granted ended (see endChains).
type leafLife struct {
	start, crash time.Time
	lapsed, ends map[string]time.Time
}

type capChange struct {
	at       time.Duration
	capacity float64
}

// capProc is one process: its role and settings, and its current
// incarnation (nil while crashed).
type capProc struct {
	i      int
	role   int
	addr   string
	addrs  []string // a client's or leaf's servers
	gauge  bool     // a client of gauges
	mode   Mode
	wants  float64
	inc    *capInc
	paused bool
	held   []func(Leadership) // leadership reports held while paused
}

// capInc is one incarnation of a process.
type capInc struct {
	link   *simLink
	server *Server
	stop   context.CancelFunc // stops Run and the load
	client *Client
	rand   *rand.Rand // the load's own draws; used by its goroutine only
	handle map[string]capHandle
	wg     sync.WaitGroup
}

// capHandle is an open resource of a client.
type capHandle struct {
	r    *Resource
	g    *GaugeResource // nil for a rate
	q    *RateResource
	leaf int // the process of the client's leaf in a tree, -1 outside trees
}

func newCapWorld(env *faultsim.Env) faultsim.World {
	r := env.Rand
	w := &capWorld{env: env, topo: r.IntN(numTopos), tracing: os.Getenv("THROTTLE_SIM_TRACE") == "1"}
	w.lease = []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second}[r.IntN(3)]
	capacity := []float64{10, 12, 120}[r.IntN(3)]
	w.cfg = Config{Resources: []Template{{ID: "*", Capacity: capacity, LeaseLength: w.lease}}}
	w.history = []capChange{{0, capacity}}
	w.ids = []string{"db"}
	if env.Sched.Load == faultsim.NewKeys {
		w.ids = []string{"k0", "k1", "k2", "k3"}
	}
	if w.topo == topoElection {
		w.elect = &simElection{w: w, subs: map[string]func(Leadership){}}
	}
	for i := range env.Spec.Procs {
		w.procs = append(w.procs, w.newProc(i, capacity))
	}
	env.Describe(fmt.Sprintf("%s; capacity %v, lease %v", topoNames[w.topo], capacity, w.lease))
	if w.tracing {
		env.T.Logf("%s; capacity %v, lease %v; %v", topoNames[w.topo], capacity, w.lease, env.Sched)
		for _, p := range w.procs {
			env.T.Logf("p%d: role %d, addrs %v, wants %v, gauge %v, mode %v", p.i, p.role, p.addrs, p.wants, p.gauge, p.mode)
		}
	}
	for _, p := range w.procs {
		w.start(p)
	}
	return w
}

// newProc draws process i's role and settings.
func (w *capWorld) newProc(i int, capacity float64) *capProc {
	r := w.env.Rand
	p := &capProc{i: i, role: roleClient, addr: addrOf(i), mode: []Mode{Safe, Pessimistic}[r.IntN(2)], gauge: r.IntN(2) == 0}
	p.wants = capacity * float64(1+r.IntN(20)) / 10 // 0.1 to 2 times the capacity
	if w.env.Sched.Load == faultsim.HotKey {
		p.wants = 2 * capacity
	}
	switch w.topo {
	case topoSingle:
		if i == 0 {
			p.role = roleServer
		}
		p.addrs = []string{addrOf(0)}
	case topoElection:
		if i < 2 {
			p.role = roleServer
		}
		p.addrs = []string{addrOf(0), addrOf(1)}
		if r.IntN(2) == 0 {
			slices.Reverse(p.addrs)
		}
	case topoTree:
		switch {
		case i == 0:
			p.role = roleServer
		case i <= 2:
			p.role, p.addrs = roleLeaf, []string{addrOf(0)}
		default:
			p.addrs = []string{addrOf(1 + i%2)}
		}
	}
	return p
}

func addrOf(i int) string { return "p" + strconv.Itoa(i) }

func procOf(addr string) int {
	i, err := strconv.Atoi(addr[1:])
	if err != nil {
		return -1
	}
	return i
}

// start starts a new incarnation of p, with its state new.
func (w *capWorld) start(p *capProc) {
	ctx, stop := context.WithCancel(context.Background())
	inc := &capInc{link: &simLink{w: w, proc: p.i, dead: make(chan struct{})}, stop: stop,
		rand: rand.New(rand.NewPCG(w.env.Rand.Uint64(), uint64(p.i))), handle: map[string]capHandle{}}
	// Calls time out after 1s; a failed refresh is retried after 250ms,
	// doubling.
	copts := []ClientOption{WithRequestTimeout(time.Second), WithRetry(250 * time.Millisecond), WithMinRefreshGap(100 * time.Millisecond)}
	switch p.role {
	case roleServer, roleLeaf:
		opts := []ServerOption{withSeed(w.env.Rand.Uint64() | 1), WithServerClock(w.env.Clocks[p.i].Monotonic())}
		if p.role == roleLeaf {
			opts = append(opts, WithParent(inc.link, p.addrs, append(copts, WithClientID("leaf"+strconv.Itoa(p.i)))...))
		}
		w.mu.Lock()
		cfg := w.cfg
		w.mu.Unlock()
		s, err := NewServer(cfg, opts...)
		if err != nil {
			w.env.T.Fatal(err)
		}
		inc.server = s
		if p.role == roleLeaf {
			w.mu.Lock()
			if w.lives == nil {
				w.lives = map[*Server]*leafLife{}
			}
			w.lives[s] = &leafLife{start: time.Now()}
			w.mu.Unlock()
		}
		if w.elect != nil {
			go func() { _ = s.Run(ctx, w.elect, p.addr) }()
		}
	case roleClient:
		c, err := NewClient(inc.link, p.addrs, append(copts, WithClientID("c"+strconv.Itoa(p.i)), WithMode(p.mode))...)
		if err != nil {
			w.env.T.Fatal(err)
		}
		inc.client = c
	}
	w.mu.Lock()
	p.inc = inc
	w.mu.Unlock()
	if p.role == roleClient {
		w.open(p, inc, w.ids[0])
		inc.wg.Add(1)
		go w.load(ctx, p, inc)
	}
}

// open opens resource id on p's client, a gauge or a rate.
func (w *capWorld) open(p *capProc, inc *capInc, id string) {
	h := capHandle{leaf: -1}
	if w.topo == topoTree {
		h.leaf = procOf(p.addrs[0])
	}
	var err error
	if p.gauge {
		h.g, err = inc.client.Gauge(id, p.wants)
		if err == nil {
			h.r = h.g.Resource
		}
	} else {
		h.q, err = inc.client.Rate(id, p.wants)
		if err == nil {
			h.r = h.q.Resource
		}
	}
	if err != nil {
		if errors.Is(err, throttle.ErrClosed) {
			return
		}
		w.env.T.Fatal(err)
	}
	w.mu.Lock()
	inc.handle[id] = h
	w.mu.Unlock()
}

// crash ends p's incarnation as a crash does: its calls fail from now on,
// nothing is given back, and what it held is gone.
func (w *capWorld) crash(p *capProc) {
	w.mu.Lock()
	inc := p.inc
	p.inc = nil
	w.mu.Unlock()
	if inc == nil {
		return
	}
	if p.role == roleLeaf {
		w.endChains(inc.server)
	}
	close(inc.link.dead)
	inc.stop()
	inc.wg.Wait()
	w.stopInc(inc)
}

// endChains records, for each resource, when the leases that crashed
// leaf server s granted end for good: at the expiry of its own lease at
// the root (its clients' leases end no later), now if it holds none. Its
// clients' units taken under them are carried from then on, whatever a
// later life of the leaf grants them. Each life has its own end: a unit
// taken under an earlier life's lease is carried once that life's chain
// ended, even while a later life holds a lease at the root (of 0, say).
func (w *capWorld) endChains(s *Server) {
	ends, lapses := map[string]time.Time{}, map[string]time.Time{}
	for _, id := range w.ids {
		ends[id], lapses[id] = time.Now(), parentLapsed(s, id)
		if l, ok := s.parentLease(id); ok {
			ends[id] = l.Expiry
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	life := w.lives[s]
	life.crash, life.lapsed, life.ends = time.Now(), lapses, ends
}

// stopInc stops an incarnation's goroutines.
func (w *capWorld) stopInc(inc *capInc) {
	what, limit := "Client.Close", time.Duration(2*2+1)*time.Second+time.Second
	w.env.Within(what, limit, func() {
		if inc.client != nil {
			_ = inc.client.Close()
		}
		if inc.server != nil {
			_ = inc.server.Close()
		}
	})
}

func (w *capWorld) Apply(e faultsim.Event) {
	switch e.Kind {
	case faultsim.Pause:
		w.mu.Lock()
		w.procs[e.From].paused = true
		w.mu.Unlock()
		w.elect.down(e.From)
	case faultsim.Crash:
		w.crash(w.procs[e.From])
		w.elect.down(e.From)
	case faultsim.Config:
		w.configure(e.Value)
	case faultsim.Skew:
		w.mu.Lock()
		if w.procs[e.From].role != roleClient {
			w.skew = max(w.skew, math.Abs(e.P))
		}
		w.mu.Unlock()
	}
}

func (w *capWorld) End(e faultsim.Event) {
	p := w.procs[e.From]
	switch e.Kind {
	case faultsim.Pause:
		w.mu.Lock()
		p.paused = false
		held := p.held
		p.held = nil
		w.mu.Unlock()
		w.elect.resumed(held)
	case faultsim.Crash:
		w.start(p)
	}
}

// configure changes the capacity of the servers without a parent to a
// value drawn from v: half, the same, or 1.5 times the first one.
func (w *capWorld) configure(v uint64) {
	w.mu.Lock()
	capacity := w.history[0].capacity * []float64{0.5, 1, 1.5}[v%3]
	lower := capacity < w.cfg.Resources[0].Capacity
	w.cfg.Resources[0].Capacity = capacity
	cfg := w.cfg
	w.history = append(w.history, capChange{w.env.Elapsed(), capacity})
	var servers []*Server
	var gauges []*GaugeResource
	for _, p := range w.procs {
		if p.role == roleServer && p.inc != nil {
			servers = append(servers, p.inc.server)
		}
		if p.inc != nil && lower {
			for _, h := range p.inc.handle {
				if h.g != nil {
					gauges = append(gauges, h.g)
				}
			}
		}
	}
	w.mu.Unlock()
	// No unit is taken back when the capacity drops: those held then
	// drain as they are released, on top of the new capacity.
	for _, g := range gauges {
		w.keep(g)
	}
	for _, s := range servers {
		if err := s.SetConfig(cfg); err != nil {
			w.env.T.Fatal(err)
		}
	}
}

// bound is the largest capacity configured within the last lease length:
// after a change the sum may stay at the old capacity until the leases
// granted before it have been confirmed lower or expired.
func (w *capWorld) bound(now time.Duration) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := 0.0
	for i, c := range w.history {
		if i+1 < len(w.history) && w.history[i+1].at < now-w.lease {
			continue // replaced more than a lease ago
		}
		b = max(b, c.capacity)
	}
	return b
}

// Check sums, per resource, what the live clients enforce now.
func (w *capWorld) Check(now time.Duration) error {
	bound := w.bound(now)
	w.mu.Lock()
	var hs []capHandle
	for _, p := range w.procs {
		if p.inc != nil {
			for _, h := range p.inc.handle {
				hs = append(hs, h)
			}
		}
	}
	w.mu.Unlock()
	for _, id := range w.ids {
		leases, enforced, kept := 0.0, 0.0, 0.0
		each, keeps := make([]float64, len(hs)), make([]float64, len(hs))
		for i, h := range hs {
			if h.r.ID() != id {
				continue
			}
			c, e := h.r.Capacity(), h.r.Capacity()
			if h.g != nil {
				// The units left out take up their part of the limit.
				fresh, carried := w.fresh(h)
				c = max(c-carried, 0)
				e = max(c, fresh)
				kept, keeps[i] = kept+carried, carried
			}
			leases, enforced, each[i] = leases+c, enforced+e, e
		}
		if w.tracing && now%(250*time.Millisecond) == 0 {
			w.env.T.Logf("%v %s Σ %v:%s%s", now, id, enforced, detail(hs, id, each, keeps), w.servers(id))
		}
		if err := w.judge(id, now, bound, leases, enforced); err != nil {
			return fmt.Errorf("%w (leases %v;%s)", err, leases, detail(hs, id, each, keeps))
		}
		keptStats.note(w.topo, (enforced+kept)/bound)
	}
	return nil
}

// keptStats is, per topology, the largest sum of what the clients enforce
// and the gauge units they keep past their chain of leases (or from before
// a capacity drop), over the bound: what the guarantee leaves out, which
// the registry states (cap-gauge).
var keptStats keptMax

type keptMax struct {
	sync.Mutex
	worst [numTopos]float64
}

func (k *keptMax) note(topo int, ratio float64) {
	k.Lock()
	defer k.Unlock()
	k.worst[topo] = max(k.worst[topo], ratio)
}

// detail lists what each client enforces on resource id and, after it,
// the gauge units it keeps past the end of their chain of leases (left
// out of the sum).
func detail(hs []capHandle, id string, each, keeps []float64) string {
	var b strings.Builder
	for i, h := range hs {
		if h.r.ID() != id {
			continue
		}
		fmt.Fprintf(&b, " %s:%v", h.r.c.ID(), each[i])
		if keeps[i] > 0 {
			fmt.Fprintf(&b, " (+%v kept)", keeps[i])
		}
	}
	return b.String()
}

// servers describes, for a trace, what each server has of resource id
// and holds from its parent. It reads them as they are, not through
// Status, whose sweep of unused resources would change the run traced.
func (w *capWorld) servers(id string) string {
	out := ""
	for _, p := range w.procs {
		s := w.serverAt(p.i)
		if p.role == roleClient || s == nil {
			continue
		}
		if c, held, ok := peek(s, id); ok {
			out += fmt.Sprintf(" | %s cap %v held %v", p.addr, c, held)
		}
		if l, ok := s.parentLease(id); ok {
			out += fmt.Sprintf(" lease %v until %v", l.Capacity, time.Until(l.Expiry))
		}
	}
	return out
}

// peek returns the capacity of resource id at s and what its clients
// hold there, changing nothing (no sweep, no expiry); ok is false if s
// has no such resource.
func peek(s *Server, id string) (capacity, held float64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.resources[id]
	if r == nil {
		return 0, 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.list {
		held += h.holds()
	}
	return r.tmpl.Capacity, held, true
}

// unitBook is what the checker knows of the units a gauge holds: when
// each was taken and under whose lease, and the gauge's last carry point
// (the capacity lowered).
type unitBook struct {
	next  uint64
	mark  time.Time
	taken map[uint64]unit
}

// unit is a unit a gauge took: when, and the server whose answer gave
// the client the lease it was taken under (in a tree, a life of its
// leaf).
type unit struct {
	at time.Time
	by *Server
}

// book returns g's book. w.mu is held.
func (w *capWorld) book(g *GaugeResource) *unitBook {
	if w.units == nil {
		w.units = map[*GaugeResource]*unitBook{}
	}
	b := w.units[g]
	if b == nil {
		b = &unitBook{taken: map[uint64]unit{}}
		w.units[g] = b
	}
	return b
}

// took records a unit g took on inc's client, and returns the release
// that gives it back and strikes it from the book at once, so that a
// sample never sees the one without the other.
func (w *capWorld) took(inc *capInc, g *GaugeResource, release func()) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.book(g)
	id := b.next
	b.next++
	b.taken[id] = unit{at: time.Now(), by: inc.link.grantor}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		release()
		delete(b.taken, id)
	}
}

// keep leaves the units g holds now out of its count until released.
func (w *capWorld) keep(g *GaugeResource) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.book(g).mark = time.Now()
}

// lapsed returns when r's last lease ran out before a new one came.
func lapsed(r *Resource) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked(time.Now())
	return r.lapsed
}

// parentLapsed returns when s's last lease from its parent on resource id
// (band 0) ran out before a new one came; zero if s has none.
func parentLapsed(s *Server, id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[id]
	if r == nil || r.up == nil || r.up.bands[0] == nil {
		return time.Time{}
	}
	return lapsed(r.up.bands[0].r)
}

// fresh returns the units h's gauge holds that the gauge guarantee
// covers, and the others (carried): those taken before its chain of
// leases last ran out, or before the capacity was lowered, and not
// released since, each unit known by when it was taken and under whose
// lease (units are told apart, not only counted). The chain is the
// client's lease and, in a tree, the lease at the root of the leaf life
// that granted it (a leaf that holds none grants 0, and the root no
// longer counts what it granted before); a life that crashed ended its
// chain (see endChains). Units a client keeps past the chain's expiry,
// while it or its leaf cannot reach the servers above or after its leaf
// crashed, come on top until it releases them (by design: the semaphore
// takes no unit back), as do those held when the capacity drops; they
// are left out, as long as they are held, with the part of the limit
// they take up (the client stops reporting them once no server can count
// them any more, so that a server learning after a restart does not
// confirm them as a lease).
func (w *capWorld) fresh(h capHandle) (fresh, carried float64) {
	g := h.g
	mark := lapsed(g.Resource)
	cur := w.serverAt(h.leaf)
	w.mu.Lock()
	b := w.book(g)
	if b.mark.After(mark) {
		mark = b.mark
	}
	ends := map[*Server]time.Time{} // per lease giver, when its chain ran out
	for _, u := range b.taken {
		ends[u.by] = time.Time{}
	}
	w.mu.Unlock()
	for by := range ends {
		ends[by] = w.chainEnd(by, cur, g.ID())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	held := g.InFlight()
	n := 0
	for _, u := range b.taken {
		if !u.at.After(mark) || !u.at.After(ends[u.by]) {
			n++ // a unit booked since is fresh: its end is zero
		}
	}
	n = min(n, held) // a unit taken and not yet in the book is fresh
	return float64(held - n), float64(n)
}

// chainEnd returns when the leaf's part of the chain of leases that
// server by's grants on resource id hang from last ran out: when by's
// lease at the root last lapsed; for a life that crashed, also the end of
// the leases it granted, once that has passed. Zero outside trees; a
// grant from no leaf counts as the current life's (cur).
func (w *capWorld) chainEnd(by, cur *Server, id string) time.Time {
	w.mu.Lock()
	life := w.lives[by]
	crashed := life != nil && !life.crash.IsZero()
	var m time.Time
	if crashed {
		m = life.lapsed[id]
		if end := life.ends[id]; end.After(m) && !end.After(time.Now()) {
			m = end
		}
	}
	w.mu.Unlock()
	switch {
	case crashed:
		return m
	case life == nil:
		by = cur
	}
	if by == nil {
		return time.Time{}
	}
	return parentLapsed(by, id)
}

// skewStats is what the runs measured past the bound while a server's
// clock ran at another rate, which the guarantee does not cover.
var skewStats struct {
	sync.Mutex
	episodes  int
	worst     float64 // the largest sum over its bound, as a ratio
	longest   time.Duration
	worstSkew float64
}

// judge returns a violation when the sum enforced on resource id is over
// its bound: at once without clock skew; with a server's clock running at
// rate 1±ρ, only when it lasts more than 2ρ·lease (a lease can outlast its
// count at the server by ρ·lease, twice in a tree) and two samples.
func (w *capWorld) judge(id string, now time.Duration, bound, leases, enforced float64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over == nil {
		w.over = map[string]time.Duration{}
	}
	if enforced <= bound*(1+1e-12) {
		delete(w.over, id)
		return nil
	}
	since, ok := w.over[id]
	if !ok {
		since, w.over[id] = now, now
	}
	class := "leases over capacity"
	if leases <= bound*(1+1e-12) {
		class = "gauge units held over capacity"
	}
	if w.skew > 0 {
		allowed := time.Duration(2*w.skew*float64(w.lease)) + 2*w.env.Spec.Sample
		skewStats.Lock()
		defer skewStats.Unlock()
		if now-since <= allowed {
			skewStats.episodes++
			skewStats.worst = max(skewStats.worst, enforced/bound)
			skewStats.longest = max(skewStats.longest, now-since)
			skewStats.worstSkew = max(skewStats.worstSkew, w.skew)
			return nil
		}
		class += " under clock skew"
	}
	return fmt.Errorf("%s: resource %q: Σ enforced %v > %v for %v", class, id, enforced, bound, now-since)
}

func (w *capWorld) Close() {
	w.mu.Lock()
	var incs []*capInc
	for _, p := range w.procs {
		if p.inc != nil {
			incs = append(incs, p.inc)
			p.inc.stop()
		}
	}
	w.mu.Unlock()
	for _, inc := range incs {
		inc.wg.Wait()
		w.stopInc(inc)
	}
}

// load drives one client incarnation until ctx is done: its demand
// changes (Bursty), new resources (NewKeys), and units held on gauges for
// a while or asked of rates.
func (w *capWorld) load(ctx context.Context, p *capProc, inc *capInc) {
	defer inc.wg.Done()
	r := inc.rand
	tick := time.NewTicker(time.Duration(50+r.IntN(200)) * time.Millisecond)
	defer tick.Stop()
	next := time.Now().Add(time.Duration(1+r.IntN(5)) * time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		w.mu.Lock()
		paused := p.paused
		hs := make([]capHandle, 0, len(inc.handle))
		for _, id := range w.ids {
			if h, ok := inc.handle[id]; ok {
				hs = append(hs, h)
			}
		}
		w.mu.Unlock()
		if paused {
			continue
		}
		for _, h := range hs {
			w.use(ctx, inc, h)
		}
		if time.Now().After(next) {
			next = time.Now().Add(time.Duration(1+r.IntN(5)) * time.Second)
			w.change(p, inc, hs)
		}
	}
}

// use takes a unit of h: a gauge's for a while (released later), a rate's
// at once.
func (w *capWorld) use(ctx context.Context, inc *capInc, h capHandle) {
	const instant = 10 * time.Millisecond // the stated time of a call that never waits
	if h.q != nil {
		w.env.Within("RateResource.Allow", instant, func() { _, _ = h.q.Allow(ctx, "", 1) })
		return
	}
	var d throttle.Decision
	var release func()
	w.env.Within("GaugeResource.TryHold", instant, func() { d, release, _ = h.g.TryHold(ctx, "", 1) })
	if d.Allowed {
		release = w.took(inc, h.g, release)
		hold := time.Duration(500+inc.rand.IntN(8000)) * time.Millisecond
		t := time.AfterFunc(hold, release)
		context.AfterFunc(ctx, func() { t.Stop() }) // a crash loses the units with the process
	}
}

// change changes p's demand by the load: new wants (Bursty), or another
// resource opened or one closed (NewKeys).
func (w *capWorld) change(p *capProc, inc *capInc, hs []capHandle) {
	r := inc.rand
	switch w.env.Sched.Load {
	case faultsim.Bursty:
		h := hs[r.IntN(len(hs))]
		wants := p.wants * []float64{0, 0.5, 1, 3}[r.IntN(4)]
		w.env.Within("Resource.SetWants", 10*time.Millisecond, func() { _ = h.r.SetWants(wants) })
	case faultsim.NewKeys:
		id := w.ids[r.IntN(len(w.ids))]
		w.mu.Lock()
		h, open := inc.handle[id]
		shut := open && len(inc.handle) > 1 && (h.g == nil || h.g.InFlight() == 0)
		if shut {
			delete(inc.handle, id)
		}
		w.mu.Unlock()
		switch {
		case !open:
			w.open(p, inc, id)
		case shut:
			w.env.Within("Resource.Close", 6*time.Second, func() { _ = h.r.Close() })
		}
	}
}

// simLink is the Transport of one incarnation of a process: every call
// is a request message and an answer message through the simulation's
// Net. The server's context ends when a cancellation sent by the caller
// (on giving up, or once answered) arrives, as a stream reset does.
type simLink struct {
	w    *capWorld
	proc int
	dead chan struct{} // closed when the incarnation crashes
	// grantor is the server whose answer the caller got last, in a
	// tree the newest leaf life that answered; w.mu guards it.
	grantor *Server
}

var _ Transport = (*simLink)(nil)

func (l *simLink) GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error) {
	req = clone(req) // the caller reuses it for its next try
	if l.w.tracing {
		l.w.env.T.Logf("%v p%d→%s: %+v", l.w.env.Elapsed(), l.proc, addr, *req)
	}
	a := l.call(ctx, addr, func(ctx context.Context, s *Server) (*Response, error) { return s.GetCapacity(ctx, req) })
	if a.resp != nil && a.err == nil {
		l.w.answered(l, a.by)
	}
	return a.resp, a.err
}

// answered records that server by answered l's caller: its leases come
// from by from now on. A leaf's earlier life never takes over from a
// later one.
func (w *capWorld) answered(l *simLink, by *Server) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, now := w.lives[l.grantor], w.lives[by]; old == nil || now == nil || !now.start.Before(old.start) {
		l.grantor = by
	}
}

func (l *simLink) Release(ctx context.Context, addr string, req *ReleaseRequest) (*Response, error) {
	r := *req
	if l.w.tracing {
		l.w.env.T.Logf("%v p%d→%s: release %+v", l.w.env.Elapsed(), l.proc, addr, r)
	}
	a := l.call(ctx, addr, func(ctx context.Context, s *Server) (*Response, error) { return s.Release(ctx, &r) })
	return a.resp, a.err
}

type simAnswer struct {
	resp *Response
	err  error
	by   *Server // the server that answered
}

// simCrashed is the answer to a call of an incarnation that crashed.
var simCrashed = simAnswer{err: fmt.Errorf("%w: capacity: crashed", throttle.ErrUnavailable)}

// call sends serve to the server at addr and waits for its answer, ctx's
// end or the incarnation's crash.
func (l *simLink) call(ctx context.Context, addr string, serve func(context.Context, *Server) (*Response, error)) simAnswer {
	select {
	case <-l.dead:
		return simCrashed
	default:
	}
	to := procOf(addr)
	net := l.w.env.Net
	answers := make(chan simAnswer, 2) // room for a duplicate's
	sctx, cancel := context.WithCancel(context.Background())
	defer net.Send(l.proc, to, cancel)
	net.Send(l.proc, to, func() {
		// Served on the Net's goroutine, in the order of arrival: a
		// Server call does not wait on the network.
		s := l.w.serverAt(to)
		if s == nil {
			return
		}
		a := simAnswer{by: s}
		l.w.env.Within("Server.GetCapacity", 100*time.Millisecond, func() { a.resp, a.err = serve(sctx, s) })
		if l.w.tracing && a.resp != nil {
			l.w.env.T.Logf("%v p%d→p%d: %+v", l.w.env.Elapsed(), to, l.proc, *a.resp)
		}
		net.Send(to, l.proc, func() {
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
		return simAnswer{err: fmt.Errorf("%w: capacity: %v", throttle.ErrUnavailable, ctx.Err())}
	case <-l.dead:
		return simCrashed
	}
}

// serverAt returns the server of process i's current incarnation, nil
// if it has none.
func (w *capWorld) serverAt(i int) *Server {
	if i < 0 || i >= len(w.procs) {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if inc := w.procs[i].inc; inc != nil {
		return inc.server
	}
	return nil
}

// simElection elects one of two replicas, as an election with a session
// TTL does: a master that crashes or pauses loses mastership after the
// TTL, and another replica that is up is elected in a new term. A paused
// replica hears of changes when it resumes.
type simElection struct {
	w    *capWorld
	mu   sync.Mutex
	term int64
	lead string
	subs map[string]func(Leadership)
}

// simTTL is the election's session TTL.
const simTTL = time.Second

func (e *simElection) Campaign(ctx context.Context, addr string, report func(Leadership)) error {
	e.mu.Lock()
	e.subs[addr] = report
	if e.lead == "" {
		e.electLocked(addr)
	} else {
		report(Leadership{Master: e.lead, Term: e.term})
	}
	e.mu.Unlock()
	<-ctx.Done()
	e.mu.Lock()
	delete(e.subs, addr)
	if e.lead == addr {
		e.lead = ""
		time.AfterFunc(simTTL, e.elect)
	}
	e.mu.Unlock()
	return ctx.Err()
}

// electLocked makes addr the master in a new term and tells every
// replica; e.mu is held.
func (e *simElection) electLocked(addr string) {
	e.term++
	e.lead = addr
	l := Leadership{Master: addr, Term: e.term}
	for a, report := range e.subs {
		l.IsMaster = a == addr
		e.w.mu.Lock()
		p := e.w.procs[procOf(a)]
		if p.paused {
			l := l
			p.held = append(p.held, func(Leadership) { report(l) })
			e.w.mu.Unlock()
			continue
		}
		e.w.mu.Unlock()
		report(l)
	}
}

// elect elects a replica that is up when the master is gone.
func (e *simElection) elect() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lead != "" && e.w.env.Net.Up(procOf(e.lead)) {
		return
	}
	for _, a := range slices.Sorted(maps.Keys(e.subs)) {
		if a != e.lead && e.w.env.Net.Up(procOf(a)) {
			e.electLocked(a)
			return
		}
	}
	if e.lead == "" {
		time.AfterFunc(simTTL, e.elect) // none up: try again later
	}
}

// down notes that replica i stopped: a master loses its mastership after
// the TTL unless it is back.
func (e *simElection) down(i int) {
	if e == nil || i > 1 {
		return
	}
	time.AfterFunc(simTTL, e.elect)
}

// resumed delivers the reports a paused replica missed.
func (e *simElection) resumed(held []func(Leadership)) {
	if e == nil {
		return
	}
	e.mu.Lock()
	for _, f := range held {
		f(Leadership{})
	}
	e.mu.Unlock()
	e.elect()
}
