package capacity

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
)

// fault is what happens to one client's calls, or to every call to one
// address.
type fault struct {
	drop bool          // the server acts on the call; the answer is lost
	late time.Duration // the answer arrives this much later
	hang bool          // the call never arrives and no answer comes
	// The call reaches the server this much later, whether or not the
	// caller still waits: its cancellation does not reach the server, as
	// over a network that holds a request up.
	slowIn time.Duration
}

// faultNet is a memNetwork whose calls suffer faults: by client id, and by
// server address ("@" + addr). A lost answer or a hanging call makes the
// caller wait for its own timeout, as on a real network that swallows
// packets.
type faultNet struct {
	*memNetwork
	mu     sync.Mutex
	faults map[string]fault
}

func newFaultNet() *faultNet {
	return &faultNet{memNetwork: new(memNetwork), faults: map[string]fault{}}
}

func (f *faultNet) set(key string, fl fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[key] = fl
}

func (f *faultNet) get(client, addr string) fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, b := f.faults[client], f.faults["@"+addr]
	return fault{drop: a.drop || b.drop, late: max(a.late, b.late), hang: a.hang || b.hang, slowIn: max(a.slowIn, b.slowIn)}
}

// call runs do on the far side of the faults.
func call(ctx context.Context, fl fault, do func(context.Context) (*Response, error)) (*Response, error) {
	lost := func() (*Response, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %v", throttle.ErrUnavailable, ctx.Err())
	}
	if fl.hang {
		return lost()
	}
	if fl.slowIn > 0 {
		type answer struct {
			resp *Response
			err  error
		}
		ch := make(chan answer, 1)
		go func() {
			time.Sleep(fl.slowIn)
			resp, err := do(context.WithoutCancel(ctx))
			ch <- answer{resp, err}
		}()
		select {
		case a := <-ch:
			return a.resp, a.err
		case <-ctx.Done():
			return lost()
		}
	}
	resp, err := do(ctx)
	if fl.drop {
		return lost()
	}
	if fl.late > 0 {
		t := time.NewTimer(fl.late)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return lost()
		}
	}
	return resp, err
}

func (f *faultNet) GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error) {
	req = clone(req) // the caller reuses it for its next try
	return call(ctx, f.get(req.Client, addr), func(ctx context.Context) (*Response, error) { return f.memNetwork.GetCapacity(ctx, addr, req) })
}

func (f *faultNet) Release(ctx context.Context, addr string, req *ReleaseRequest) (*Response, error) {
	r := *req
	return call(ctx, f.get(req.Client, addr), func(ctx context.Context) (*Response, error) { return f.memNetwork.Release(ctx, addr, &r) })
}

// clone copies req, as a network delivers a copy.
func clone(req *Request) *Request {
	c := *req
	c.Resources = append([]ResourceRequest(nil), req.Resources...)
	return &c
}

// testElection is an Election whose master the test picks.
type testElection struct {
	mu   sync.Mutex
	lead Leadership
	subs map[string]func(Leadership)
}

func (e *testElection) Campaign(ctx context.Context, address string, report func(Leadership)) error {
	e.mu.Lock()
	if e.subs == nil {
		e.subs = map[string]func(Leadership){}
	}
	e.subs[address] = report
	report(Leadership{Master: e.lead.Master, Term: e.lead.Term, IsMaster: e.lead.Master == address})
	e.mu.Unlock()
	<-ctx.Done()
	e.mu.Lock()
	delete(e.subs, address)
	e.mu.Unlock()
	return ctx.Err()
}

// elect makes master the master in a new term.
func (e *testElection) elect(master string) {
	e.mu.Lock()
	term := e.lead.Term + 1
	e.mu.Unlock()
	e.set(Leadership{Master: master, Term: term})
}

// set reports l to every candidate.
func (e *testElection) set(l Leadership) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lead = l
	for addr, report := range e.subs {
		report(Leadership{Master: l.Master, Term: l.Term, IsMaster: addr == l.Master})
	}
}

// rig runs clients and servers on virtual time and samples, every 10ms,
// the capacity the clients enforce on their leases, failing when its sum
// exceeds the bound: for Pessimistic clients (the default here) and Safe
// ones all they enforce (Capacity, what their limiters are set to: a Safe
// client without a lease uses the safe capacity, 0 unless configured),
// for Optimistic ones their unexpired leases (the last lease they keep
// using comes on top by design).
type rig struct {
	t     *testing.T
	net   *faultNet
	cfg   Config
	res   []*Resource
	bound float64
	start time.Time
	step  string
	mode  Mode // of new clients

	worst   float64
	worstAt time.Duration
	over    time.Duration
	overIn  map[string]time.Duration
	cancels []context.CancelFunc
	servers []*Server
	closers []func()
}

func newRig(t *testing.T, cfg Config, bound float64) *rig {
	g := &rig{t: t, net: newFaultNet(), cfg: cfg, bound: bound, start: time.Now(), mode: Pessimistic, overIn: map[string]time.Duration{}}
	t.Cleanup(g.close)
	return g
}

func (g *rig) close() {
	for _, c := range g.closers {
		c()
	}
	for _, c := range g.cancels {
		c()
	}
	for _, s := range g.servers {
		s.Close()
	}
	synctest.Wait()
}

// server starts a server of cfg at addr, taking part in e when not nil.
func (g *rig) server(addr string, cfg Config, e Election, opts ...ServerOption) (*Server, context.CancelFunc) {
	g.t.Helper()
	s, err := NewServer(cfg, append([]ServerOption{withSeed(uint64(len(g.servers) + 1))}, opts...)...)
	if err != nil {
		g.t.Fatal(err)
	}
	g.servers = append(g.servers, s)
	g.net.Attach(addr, s)
	if e == nil {
		return s, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancels = append(g.cancels, cancel)
	go s.Run(ctx, e, addr)
	synctest.Wait()
	return s, cancel
}

// client opens resource "r" wanting wants on a new client id.
func (g *rig) client(id string, addrs []string, wants float64, opts ...ClientOption) *RateResource {
	g.t.Helper()
	_, r := g.clientVia(g.net, id, addrs, wants, opts...)
	return r
}

// clientVia is client, calling the servers through t.
func (g *rig) clientVia(t Transport, id string, addrs []string, wants float64, opts ...ClientOption) (*Client, *RateResource) {
	g.t.Helper()
	c, err := NewClient(t, addrs, append([]ClientOption{WithClientID(id), WithMode(g.mode)}, opts...)...)
	if err != nil {
		g.t.Fatal(err)
	}
	g.closers = append(g.closers, func() {
		g.net.set(id, fault{})
		c.Close()
	})
	return c, g.rate(c, wants)
}

// rate opens resource "r" on c, its capacity sampled by run.
func (g *rig) rate(c *Client, wants float64) *RateResource {
	g.t.Helper()
	r, err := c.Rate("r", wants)
	if err != nil {
		g.t.Fatal(err)
	}
	g.res = append(g.res, r.Resource)
	return r
}

// run lets d of virtual time pass in step, sampling every 10ms.
func (g *rig) run(step string, d time.Duration) {
	g.t.Helper()
	g.step = step
	const every = 10 * time.Millisecond
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(every)
		synctest.Wait()
		var sum float64
		for _, r := range g.res {
			if r.c.set.mode != Optimistic {
				sum += r.Capacity()
			} else if l, ok := r.Lease(); ok {
				sum += l.Capacity
			}
		}
		at := time.Since(g.start)
		if sum > g.worst {
			g.worst, g.worstAt = sum, at
		}
		if sum > g.bound*(1+1e-12) {
			if g.over == 0 {
				g.t.Errorf("t=%v (%s): clients enforce %v in all > %v", at, step, sum, g.bound)
			}
			g.over += every
			g.overIn[step] += every
		}
	}
}

// report logs the worst sum, and how long and where the bound was exceeded.
func (g *rig) report() {
	g.t.Helper()
	g.t.Logf("worst Σ enforced %v (bound %v) at t=%v", g.worst, g.bound, g.worstAt)
	if g.over > 0 {
		g.t.Errorf("Σ enforced above %v for %v in all: %v", g.bound, g.over, g.overIn)
	}
}

// scenario runs steps on a new rig of cfg inside a synctest bubble, then
// reports.
func scenario(t *testing.T, cfg Config, bound float64, steps func(g *rig)) {
	synctest.Test(t, func(t *testing.T) {
		g := newRig(t, cfg, bound)
		steps(g)
		g.report()
	})
}

// heal ends the faults on key and runs for d.
func (g *rig) heal(key string, d time.Duration) {
	g.net.set(key, fault{})
	g.run("healed", d)
}

// issueConfig is the issue's setting: capacity 100, lease 10s, refresh 2s.
func issueConfig() Config {
	return Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
}

// warm starts a server at "s1" and lets it learn.
func (g *rig) warm() *Server {
	s, _ := g.server("s1", g.cfg, nil)
	time.Sleep(g.cfg.Resources[0].LeaseLength)
	return s
}

// takeover lets client "a" take all of the capacity, then client "b" ask
// for all of it while a's calls suffer f.
func (g *rig) takeover(addrs []string, f fault) *RateResource {
	a := g.client("a", addrs, 100)
	g.run("a alone", 5*time.Second)
	g.net.set("a", f)
	g.client("b", addrs, 100)
	return a
}

// TestFaultLoweredLeaseAnswerLost: A holds all 100, B asks for 100, and
// every answer to A is lost (or late): A keeps its 100 until its lease
// expires, so B must get nothing of it until then.
func TestFaultLoweredLeaseAnswerLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fault
		mode Mode
	}{
		{"lost", fault{drop: true}, Pessimistic},
		{"late2s", fault{late: 2 * time.Second}, Pessimistic},
		{"late4s", fault{late: 4 * time.Second}, Pessimistic},
		{"late6s", fault{late: 6 * time.Second}, Pessimistic}, // past the client's timeout
		{"lost/safe", fault{drop: true}, Safe},
		{"lost/optimistic", fault{drop: true}, Optimistic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scenario(t, issueConfig(), 100, func(g *rig) {
				g.mode = tc.mode
				g.warm()
				g.takeover([]string{"s1"}, tc.f)
				g.run("answers to a "+tc.name, 30*time.Second)
				g.heal("a", 10*time.Second)
			})
		})
	}
}

// TestFaultHangingNetworkExpiresOnTime: a network that swallows A's calls
// to all of its three addresses: A must stop enforcing its lease at its
// expiry although its refresh is blocked for 3 × 5s per attempt.
func TestFaultHangingNetworkExpiresOnTime(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.warm()
		a := g.takeover([]string{"s1", "s2", "s3"}, fault{hang: true})
		g.run("a's network hangs", 40*time.Second)
		if l, ok := a.Lease(); ok {
			g.t.Errorf("a still holds %+v after 40s without an answer", l)
		}
		if d, _ := a.Allow(context.Background(), "", 1); d.Allowed {
			g.t.Error("a's limiter admits on an expired lease")
		}
		g.heal("a", 20*time.Second)
	})
}

// TestFaultLatencyCountsFromSend: with 1s latency each way, a client
// counts its lease from when it sent the request, so it expires before
// the server's record of it does.
func TestFaultLatencyCountsFromSend(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.net.SetLatency(time.Second)
		g.warm()
		g.takeover([]string{"s1"}, fault{hang: true})
		g.run("a cut off", 20*time.Second)
		g.heal("a", 10*time.Second)
	})
}

// TestFaultFailover runs three replicas under an election: the master is
// killed, then the next one pauses (its calls hang) while a third, with
// shorter leases, takes over; answers get lost around the changes.
func TestFaultFailover(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		e := &testElection{}
		addrs := []string{"s1", "s2", "s3"}
		e.elect("s1")
		_, kill1 := g.server("s1", g.cfg, e)
		g.server("s2", g.cfg, e)
		// s3 grants 2s leases, and learns for the 10s ones of the others.
		short := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 2 * time.Second, RefreshInterval: time.Second, MaxLeaseLength: 10 * time.Second}}}
		g.server("s3", short, e)
		time.Sleep(10 * time.Second)
		g.client("a", addrs, 70)
		g.client("b", addrs, 70)
		g.run("two clients", 10*time.Second)
		g.client("c", addrs, 70)
		g.net.set("b", fault{drop: true})
		g.run("answers to b lost", 3*time.Second)

		g.net.SetDown("s1", true)
		kill1()
		e.elect("s2")
		g.run("s1 killed, s2 learns", 15*time.Second)
		g.net.set("b", fault{})
		g.run("s2 serves", 15*time.Second)

		g.net.set("@s2", fault{hang: true}) // s2 pauses
		e.elect("s3")
		g.net.set("a", fault{drop: true})
		g.run("s2 paused, s3 learns", 15*time.Second)
		g.net.set("a", fault{})
		g.net.set("@s2", fault{}) // s2 resumes, told it lost
		g.run("s3 serves", 15*time.Second)
	})
}

// TestFaultRestartShorterLease: the server restarts with a lease of 2s
// instead of 10s while A, cut off, still holds its 10s lease from before:
// the new server must learn for the longest lease any master may have
// granted.
func TestFaultRestartShorterLease(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.warm()
		g.client("a", []string{"s1"}, 100)
		g.run("a alone", 5*time.Second)
		g.net.set("a", fault{hang: true})
		short := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 2 * time.Second, RefreshInterval: time.Second, MaxLeaseLength: 10 * time.Second}}}
		g.server("s1", short, nil) // restart: all state lost
		g.client("b", []string{"s1"}, 100)
		g.run("restarted with 2s leases", 20*time.Second)
		g.heal("a", 10*time.Second)
	})
}

// TestFaultConfigChanges lowers and raises the capacity while answers are
// lost: Σ may exceed the new capacity only with leases granted before the
// change, so never the old one, and not the new one once they expired.
func TestFaultConfigChanges(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		s := g.warm()
		g.client("a", []string{"s1"}, 60)
		g.client("b", []string{"s1"}, 60)
		g.run("two clients", 10*time.Second)
		low := issueConfig()
		low.Resources[0].Capacity = 50
		g.net.set("a", fault{drop: true})
		if err := s.SetConfig(low); err != nil {
			g.t.Fatal(err)
		}
		g.run("lowered to 50, answers to a lost", 12*time.Second) // a's old lease expires
		g.bound = 50
		g.run("at 50", 10*time.Second)
		g.heal("a", 10*time.Second)
		if err := s.SetConfig(issueConfig()); err != nil {
			g.t.Fatal(err)
		}
		g.bound = 100
		g.client("c", []string{"s1"}, 60)
		g.run("raised to 100", 10*time.Second)
	})
}

// TestFaultHugeWants: wants at the edges of float64 share like any other.
func TestFaultHugeWants(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.warm()
		g.client("a", []string{"s1"}, math.MaxFloat64)
		g.client("b", []string{"s1"}, 1e308)
		g.client("c", []string{"s1"}, 30)
		g.net.set("b", fault{late: 3 * time.Second})
		g.run("huge wants", 30*time.Second)
	})
}

// TestFaultLearningConfirmsWithinCapacity: a master with half the
// capacity takes over; clients report the leases of the old one, answers
// to one are lost. The new master confirms at most its capacity in total,
// so once the old leases have expired Σ is within it.
func TestFaultLearningConfirmsWithinCapacity(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		e := &testElection{}
		addrs := []string{"s1", "s2"}
		e.elect("s1")
		_, kill1 := g.server("s1", g.cfg, e)
		half := issueConfig()
		half.Resources[0].Capacity = 50
		g.server("s2", half, e)
		time.Sleep(10 * time.Second)
		for _, id := range []string{"a", "b", "c"} {
			g.client(id, addrs, 50)
		}
		g.run("three clients", 10*time.Second)
		g.net.SetDown("s1", true)
		kill1()
		e.elect("s2")
		g.net.set("a", fault{drop: true})
		g.run("s2 learns, answers to a lost", 10*time.Second) // the old leases expire
		g.bound = 50
		g.run("s2 shares 50", 10*time.Second)
		g.heal("a", 10*time.Second)
	})
}

// TestFaultGrantArrivingExpiredNeverApplies: an answer later than its
// lease (the client waits up to 30s) is never applied, not even for an
// instant to the limiter.
func TestFaultGrantArrivingExpiredNeverApplies(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.warm()
		g.net.set("a", fault{late: 12 * time.Second})
		c, err := NewClient(g.net, []string{"s1"}, WithClientID("a"), WithMode(Pessimistic), WithRequestTimeout(30*time.Second))
		if err != nil {
			g.t.Fatal(err)
		}
		defer c.Close()
		r, err := c.newResource("r", 100, nil)
		if err != nil {
			g.t.Fatal(err)
		}
		var applied []float64
		r.apply = func(v float64) { applied = append(applied, v) }
		if err := c.add(r); err != nil {
			g.t.Fatal(err)
		}
		g.res = append(g.res, r)
		g.run("answers 12s late", 30*time.Second)
		if len(applied) != 0 {
			g.t.Errorf("applied %v from leases that arrived expired", applied)
		}
		g.net.set("a", fault{})
	})
}
