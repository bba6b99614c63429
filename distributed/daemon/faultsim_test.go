package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/faultsim"
	"github.com/throttlekit/throttle/internal/simbound"
	"github.com/throttlekit/throttle/internal/simnet"
)

// The daemon's scenario of the fault simulator: 2 and 3 daemons with
// owner routing, gossiping over faultsim.Net, or one standalone daemon
// with a state_file, each answering Go clients at their default settings
// (timeout, policy, backoff) over in-memory connections. A daemon's host
// is the process the faults hit: a pause or a crash stops its workers
// too (a client whose own daemon is down fails open by its documented
// policy, outside the bound). A standalone daemon's crash is, by the
// seed, a SIGTERM (its state saved and restored) or a kill (nothing
// saved). A Config event reloads one daemon's peers, or rolls a new
// limit (rate, burst) out to every daemon one after the other. The
// invariant: per tag, what the clients were told "admitted" within any
// window is at most simbound.Owner's bound (standalone: one bucket, and
// a burst per kill), with the largest rate and burst in use and a fresh
// burst per limit rolled out under owner routing; also while an owner is
// paused (a client must not fail open past the fallback bucket); and
// every call returns within the client's timeout.

// Seeds that found defects (issue 38) on the code before their fixes,
// each with the minimal schedule the shrinker found (on 2 daemons).
var simDaemonSeeds = []uint64{
	12900692904911611491, // Cut for 1.8 s: each daemon owns every tag at the full rate (47 in 700 ms against 45.2)
	3066624897264386509,  // Cut for 0.9 s: likewise
	5694539742336983117,  // OneWay 0→1 for 0.9 s: answers lost, the clients fail open (25 ms) before d1 falls back (50 ms)
	11742235977915006132, // Spike of 1.3 s on d0's links: late answers, the clients fail open (61 in 1.3 s against 53)
	17487724554859307023, // Crash of d0 for 0.9 s: its tags start full, on their new owner and on its restart
	// d0 reloaded without d1 and with it again: d0's gossip numbered its
	// datagrams to d1 from 0 again, which d1 dropped as replayed, took d0
	// for dead and decided every tag on its fallback bucket for good.
	3914191939444972538, // 43 against 42 on a tag first asked 11 s later
	7203064737577305395, // 75 against 74
	// (the check's) two limits rolled out 180 ms apart to 3 daemons: the
	// earlier one reached two daemons after the later one and stayed,
	// while the bound took it out of use once the later one was out.
	4624418767857532652, // 80 against 79.9
	// Standalone: a SIGTERM restart on a clock stepped back while down
	// ignored the state file (saved "in the future"): every tag full again.
	835690510922581563,  // Crash (SIGTERM) for 76 ms, a step back of 236 ms: 31 admitted against 28
	6076404530534874524, // Crash (SIGTERM) for 2.6 s, steps back of 1.7 s and 2 s: 52 against 50.5
	// Standalone: a limit changed across a SIGTERM restart (or by a reload
	// just before it) started its tags full; a step back while down
	// refilled nothing but took nothing away either.
	1817538317673345591,  // Crash (SIGTERM) for 1.4 s, a limit rolled out meanwhile: 73 against 71.5
	3656914659721282659,  // a limit rolled out, a SIGTERM 14 ms later: 127 against 125.5
	10277358029490795012, // a step forward, a SIGTERM, a step back of 630 ms while down: 86 against 85.7
	8894369187306960128,  // (the bound's) a step back of 1.1 s, then a kill: each life refills over the same clock readings
	2186906901992982708,  // burst 20 → 40 → 20, a SIGTERM, → 40 again: the restarted daemon had no 40 bucket to reuse (109 against 108.5)
}

// simDaemonLimits are the limits a Config event rolls out: rate per
// second and burst.
var simDaemonLimits = [][2]int{{simbound.Rate, simbound.Burst}, {10, 20}, {5, 40}, {2, 10}}

func TestSimDaemon(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		name := fmt.Sprintf("n=%d", n)
		if n == 1 {
			name = "standalone"
		}
		t.Run(name, func(t *testing.T) {
			faultsim.Run(t, simbound.Spec("Daemon", n, 12, simDaemonSeeds, 25), func(env *faultsim.Env) faultsim.World { return newDaemonWorld(env) })
		})
	}
}

// daemonWorld is one run: the daemons, their clients, and what the
// clients were told.
type daemonWorld struct {
	env *faultsim.Env
	n   int
	p   simbound.Params
	*simbound.Tally
	fabric  *simnet.Fabric
	procs   []*daemonProc
	clients *simbound.Clients

	stateFile string // standalone: the daemon's state_file

	mu      sync.Mutex // guards rollout and sets
	rollout []rollout  // the limits rolled out, in order
	sets    []limitSet // the limits given to each daemon, in order
}

// limitSet is a limit given to daemon i at at (by a reload, or for its
// next restart if it is down).
type limitSet struct {
	at  time.Duration
	i   int
	lim [2]int
}

// rollout is a limit rolled out to every daemon from at to end.
type rollout struct {
	at, end time.Duration
	lim     [2]int
}

// limitChange reports whether e, a Config event, rolls a limit out
// (rather than reloading a daemon's peers).
func (w *daemonWorld) limitChange(e faultsim.Event) bool {
	return e.Kind == faultsim.Config && (w.n == 1 || e.Value>>63 == 1)
}

// killed reports whether e, a Crash of a standalone daemon, is a kill
// (nothing saved) rather than a SIGTERM; by the seed.
func (w *daemonWorld) killed(e faultsim.Event) bool {
	return w.n == 1 && rand.New(rand.NewPCG(w.env.Sched.Seed, uint64(e.At))).IntN(2) == 0
}

func gossipAddr(i int) string { return fmt.Sprintf("127.0.0.%d:7946", i+1) }
func queryAddr(i int) string  { return fmt.Sprintf("127.0.0.%d:7390", i+1) }

func newDaemonWorld(env *faultsim.Env) *daemonWorld {
	n := env.Spec.Procs
	w := &daemonWorld{env: env, n: n, p: simbound.Params{N: n, Rate: simbound.Rate, Burst: simbound.Burst}}
	if n == 1 {
		w.stateFile = filepath.Join(env.T.TempDir(), "state.json")
	}
	settle := 2*simbound.Interval + gossip.DefaultForwardTimeout + 100*time.Millisecond
	sched := env.Sched // less the limit changes, which Check bounds itself
	sched.Events = slices.DeleteFunc(slices.Clone(sched.Events), w.limitChange)
	w.Tally = simbound.NewTally(simbound.NewRunOf(env, sched, settle, 2*simbound.Interval+settle))
	var ids []string
	for i := range n {
		w.procs = append(w.procs, &daemonProc{w: w, i: i, lim: simDaemonLimits[0]})
		ids = append(ids, gossipAddr(i))
	}
	w.fabric = simnet.New(env.Net, ids)
	for _, p := range w.procs {
		p.Restart()
	}
	w.clients = simbound.StartClients(env, w.Keys, n, 4, func(i int, key string) { w.procs[i].ask(key) })
	return w
}

// config is daemon i's configuration: the default limit lim, owner
// routing, the other daemons but those left out as peers, and its
// sockets in memory; standalone, no gossip and a state_file.
func (w *daemonWorld) config(i int, left map[int]bool, lim [2]int) Config {
	var peers []string
	for j := range w.n {
		if j != i && !left[j] {
			peers = append(peers, gossipAddr(j))
		}
	}
	p := w.procs[i]
	cfg := Config{Listen: []string{"tcp:" + queryAddr(i)},
		Default: Limit{Rate: fmt.Sprintf("%d/s", lim[0]), Burst: lim[1]},
		Gossip: Gossip{Listen: gossipAddr(i), Peers: peers, Interval: Duration(simbound.Interval),
			Secret: "simulated-gossip-secret", Routing: routingOwner},
		hooks: &hooks{
			listen: func(string, string) (net.Listener, error) { return p.listen(), nil },
			gossip: func(string) (gossip.Transport, error) { return w.fabric.Endpoint(i), nil },
		}}
	if w.n == 1 {
		cfg.Gossip, cfg.StateFile = Gossip{}, w.stateFile
	}
	return cfg
}

// Apply starts a process-level fault: a pause or a crash of a daemon's
// host (standalone: a kill or a SIGTERM), a reload of a daemon's peers,
// or a limit rolled out.
func (w *daemonWorld) Apply(e faultsim.Event) {
	switch {
	case w.limitChange(e):
		w.rollOut(e)
		return
	case e.Kind == faultsim.Config:
		w.reconfigure(e)
		return
	case e.Kind == faultsim.Crash && e.From >= 0 && e.From < w.n:
		p := w.procs[e.From]
		p.mu.Lock()
		p.kill = w.killed(e)
		p.mu.Unlock()
	}
	simbound.Fault(w.procs, e, false)
}

// rollOut rolls the limit e.Value picks out to every daemon, one after
// the other in a random order, a random gap of up to 300 ms apart, as an
// operator reloads them (SIGHUP); a daemon down meanwhile restarts with
// it.
func (w *daemonWorld) rollOut(e faultsim.Event) {
	lim := simDaemonLimits[e.Value%uint64(len(simDaemonLimits))]
	r := rand.New(rand.NewPCG(e.Value, 0xc0f))
	gap := time.Duration(r.Int64N(int64(300 * time.Millisecond)))
	now := w.env.Elapsed()
	w.mu.Lock()
	w.rollout = append(w.rollout, rollout{at: now, end: now + time.Duration(w.n-1)*gap, lim: lim})
	w.mu.Unlock()
	for k, i := range r.Perm(w.n) {
		p := w.procs[i]
		time.AfterFunc(time.Duration(k)*gap, func() {
			p.mu.Lock()
			p.lim = lim
			srv, down := p.srv, p.down
			cfg := w.config(p.i, p.left, lim)
			p.mu.Unlock()
			w.mu.Lock()
			w.sets = append(w.sets, limitSet{at: w.env.Elapsed(), i: p.i, lim: lim})
			w.mu.Unlock()
			if srv != nil && !down {
				if err := srv.Reload(cfg); err != nil {
					w.env.Violate(fmt.Errorf("setup: reload: %v", err))
				}
			}
		})
	}
}

// reconfigure applies a Config event (simbound.ConfigPair): daemon u
// reloads its configuration with daemon v left out of its peers, or
// taken back.
func (w *daemonWorld) reconfigure(e faultsim.Event) {
	u, v := simbound.ConfigPair(e, w.n)
	p := w.procs[u]
	p.mu.Lock()
	if p.left == nil {
		p.left = map[int]bool{}
	}
	p.left[v] = !p.left[v]
	srv, down := p.srv, p.down
	cfg := w.config(u, p.left, p.lim)
	p.mu.Unlock()
	if srv != nil && !down {
		if err := srv.Reload(cfg); err != nil {
			w.env.Violate(fmt.Errorf("setup: reload: %v", err))
		}
	}
}

// End resumes a paused host, or restarts a crashed one (a new daemon,
// its state lost, and new workers).
func (w *daemonWorld) End(e faultsim.Event) { simbound.Fault(w.procs, e, true) }

// Check checks, per tag, every window since an earlier sample against
// the owner routing's bound, or a standalone daemon's.
func (w *daemonWorld) Check(now time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.Tally.Check(now, w.env.Clocks, "daemon-bound", w.bound); err != nil {
		return fmt.Errorf("%w (%d daemons, load %v)", err, w.n, w.env.Sched.Load)
	}
	return nil
}

// bound is the bound of a window, with the largest rate and burst of the
// limits in use over it. Standalone, one bucket (a changed limit carries
// the tag's usage, across a SIGTERM restart too) and a burst per kill
// restarted in it; a SIGTERM restart restores the state, less the debt a
// clock stepped back left (a bucket holds no fewer than 0 tokens when
// restored), and a kill starts a fresh one: rate times the steps back of
// the lives they end. Under owner
// routing, simbound.Owner and a burst per limit rolled out over the
// window (a changed limit starts its tags on a full bucket of the new
// limit; nothing is carried). Called with w.mu held.
func (w *daemonWorld) bound(win simbound.Window) float64 {
	p, fresh := w.inUse(win), 0
	for _, r := range w.rollout {
		if r.at < win.T && r.end >= win.T0 {
			fresh++
		}
	}
	if w.n > 1 {
		return simbound.Owner(p, win) + float64(fresh*p.Burst)
	}
	kills := 0
	var owed, forgiven time.Duration // the current life's steps back; those forgiven in the window
	// A crash counts at its restart: a step back while the daemon is down
	// is owed by the life that restart ends.
	evs := slices.Clone(w.env.Sched.Events)
	at := func(e faultsim.Event) time.Duration {
		if e.Kind == faultsim.Crash {
			return e.At + e.Dur
		}
		return e.At
	}
	slices.SortStableFunc(evs, func(a, b faultsim.Event) int { return cmp.Compare(at(a), at(b)) })
	for _, e := range evs {
		switch {
		case e.Kind == faultsim.ClockStep && e.D < 0:
			owed -= e.D
		case e.Kind != faultsim.Crash:
		case e.At+e.Dur <= win.T0 || e.At+e.Dur > win.T:
			owed = 0
		case w.killed(e): // a fresh bucket: the life's debt is gone too
			kills, forgiven, owed = kills+1, forgiven+owed, 0
		default: // a SIGTERM restart in the window
			forgiven, owed = forgiven+owed, 0
		}
	}
	return float64(p.Burst*(1+kills)) + p.Rate*(win.DC+forgiven).Seconds()
}

// inUse is w.p with the largest rate and burst of the limits the daemons
// have over win: each one's at its start and those given in it. Rollouts
// may overlap: a daemon may get an earlier one's limit after a later
// one's, and keep it. Called with w.mu held.
func (w *daemonWorld) inUse(win simbound.Window) simbound.Params {
	p, cur := w.p, make([][2]int, w.n)
	for i := range cur {
		cur[i] = simDaemonLimits[0]
	}
	for _, s := range w.sets {
		switch {
		case s.at <= win.T0:
			cur[s.i] = s.lim
		case s.at < win.T:
			p.Rate, p.Burst = max(p.Rate, float64(s.lim[0])), max(p.Burst, s.lim[1])
		}
	}
	for _, lim := range cur {
		p.Rate, p.Burst = max(p.Rate, float64(lim[0])), max(p.Burst, lim[1])
	}
	return p
}

// Close stops the clients and every daemon.
func (w *daemonWorld) Close() {
	w.clients.Stop()
	for _, p := range w.procs {
		p.Crash()
	}
}

// daemonProc is one host: a daemon in its current life and a client of
// it.
type daemonProc struct {
	w *daemonWorld
	i int

	mu     sync.Mutex // guards the fields below
	life   int
	srv    *Server
	cl     *client.Client
	ln     *memListener
	paused bool
	down   bool
	left   map[int]bool // daemons this life left out of its peers (Config)
	lim    [2]int       // its limit: rate per second, burst
	kill   bool         // the next Crash is a kill: nothing saved
}

// Restart begins a new life of the host: a daemon and a client.
func (p *daemonProc) Restart() {
	w := p.w
	p.mu.Lock()
	lim := p.lim
	p.mu.Unlock()
	srv, err := New(w.config(p.i, nil, lim), nil, throttle.WithClock(w.env.Clocks[p.i]))
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		w.env.Violate(fmt.Errorf("setup: %v", err))
		return
	}
	cl, err := client.New("tcp", queryAddr(p.i), client.WithDialer(p.dial))
	if err != nil {
		w.env.Violate(fmt.Errorf("setup: %v", err))
		return
	}
	p.mu.Lock()
	p.life++
	p.srv, p.cl, p.down, p.left = srv, cl, false, nil
	p.mu.Unlock()
}

// Crash stops the host's daemon and its client: the daemon's state is
// lost.
func (p *daemonProc) Crash() {
	p.mu.Lock()
	if p.down || p.srv == nil {
		p.mu.Unlock()
		return
	}
	p.down = true
	srv, cl, ln, kill := p.srv, p.cl, p.ln, p.kill
	p.kill = false
	p.mu.Unlock()
	cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	srv.Shutdown(ctx)
	cancel()
	ln.Close()
	if kill && p.w.stateFile != "" {
		os.Remove(p.w.stateFile) // killed: Shutdown never ran
	}
}

// SetPaused pauses or resumes the host.
func (p *daemonProc) SetPaused(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
}

// ask asks the host's daemon about tag through its client, as a worker
// would, unless the host is down or paused, and records what the worker
// was told (unless the host went down meanwhile: the worker with it).
func (p *daemonProc) ask(tag string) {
	p.mu.Lock()
	if p.down || p.paused {
		p.mu.Unlock()
		return
	}
	life, cl := p.life, p.cl
	p.mu.Unlock()
	w := p.w
	var ok bool
	w.env.Within(fmt.Sprintf("d%d client.Check(%q)", p.i, tag), client.DefaultTimeout+5*time.Millisecond, func() {
		ok, _ = cl.Check(context.Background(), tag)
	})
	p.mu.Lock()
	gone := p.down || p.life != life
	p.mu.Unlock()
	if gone || !ok {
		return
	}
	w.Admit(tag)
}

// listen makes the host's query listener of its current life.
func (p *daemonProc) listen() net.Listener {
	ln := &memListener{addr: queryAddr(p.i), conns: make(chan net.Conn), done: make(chan struct{})}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	return ln
}

var errRefused = errors.New("connection refused")

// dial connects to the host's daemon over a synchronous in-memory pipe.
func (p *daemonProc) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	p.mu.Lock()
	ln := p.ln
	p.mu.Unlock()
	if ln == nil {
		return nil, errRefused
	}
	c, s := net.Pipe()
	select {
	case ln.conns <- s:
		return c, nil
	case <-ln.done:
	case <-ctx.Done():
	}
	c.Close()
	s.Close()
	return nil, errRefused
}

// memListener is a query listener in memory: dial hands it the server
// end of a pipe.
type memListener struct {
	addr  string
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr(l.addr) }

type memAddr string

func (a memAddr) Network() string { return "tcp" }
func (a memAddr) String() string  { return string(a) }
