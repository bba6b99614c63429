package etcdelection

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/etcdtest"
	"github.com/throttlekit/throttle/internal/faultproxy"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testTTL keeps the fault tests short; etcd's minimum lease TTL with its
// default timing is 2s.
const testTTL = 3 * time.Second

func newClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type stamped struct {
	at time.Time
	l  capacity.Leadership
}

// replica runs one Campaign and records what it reports.
type replica struct {
	addr     string
	election *Election
	cancel   context.CancelFunc
	done     chan error
	once     sync.Once

	mu      sync.Mutex
	reports []stamped
	bound   time.Time // latest lower bound of the lease's expiry at etcd
}

func startReplica(t *testing.T, endpoint, addr string, opts ...Option) *replica {
	t.Helper()
	e, err := New(newClient(t, endpoint), "/test/"+t.Name(), append([]Option{WithTTL(testTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{addr: addr, election: e, done: make(chan error, 1)}
	e.onRenew = func(_ clientv3.LeaseID, until time.Time) {
		r.mu.Lock()
		r.bound = until
		r.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- e.Campaign(ctx, addr, func(l capacity.Leadership) {
			r.mu.Lock()
			r.reports = append(r.reports, stamped{time.Now(), l})
			r.mu.Unlock()
		})
	}()
	t.Cleanup(r.stop)
	return r
}

// stop ends the campaign and waits for it.
func (r *replica) stop() {
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; !errors.Is(err, context.Canceled) {
			panic(fmt.Sprintf("%s: Campaign = %v", r.addr, err))
		}
	})
}

func (r *replica) last() capacity.Leadership {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reports) == 0 {
		return capacity.Leadership{}
	}
	return r.reports[len(r.reports)-1].l
}

func (r *replica) history() []stamped {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]stamped(nil), r.reports...)
}

func (r *replica) lastBound() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bound
}

// firstAfter returns the time of the first report after t that matches.
func (r *replica) firstAfter(t time.Time, match func(capacity.Leadership) bool) (time.Time, bool) {
	for _, s := range r.history() {
		if s.at.After(t) && match(s.l) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Now()
}

// agreed returns the master when all running replicas agree on one: it
// reports IsMaster, the others report its address and term.
func agreed(rs ...*replica) (*replica, bool) {
	var m *replica
	for _, r := range rs {
		if r.last().IsMaster {
			if m != nil {
				return nil, false
			}
			m = r
		}
	}
	if m == nil {
		return nil, false
	}
	ml := m.last()
	for _, r := range rs {
		if l := r.last(); r != m && (l.Master != m.addr || l.Term != ml.Term) {
			return nil, false
		}
	}
	return m, true
}

func waitAgreed(t *testing.T, timeout time.Duration, rs ...*replica) *replica {
	t.Helper()
	var m *replica
	waitFor(t, timeout, "agreed master", func() bool {
		var ok bool
		m, ok = agreed(rs...)
		return ok
	})
	return m
}

// checkOneMaster fails t if two replicas ever reported IsMaster at once,
// and if a replica's terms ever went down.
func checkOneMaster(t *testing.T, rs ...*replica) {
	t.Helper()
	type ev struct {
		at     time.Time
		who    int
		master bool
	}
	var evs []ev
	for i, r := range rs {
		var term int64
		for _, s := range r.history() {
			if s.l.Term < term {
				t.Errorf("%s: term went down from %d to %d", r.addr, term, s.l.Term)
			}
			term = s.l.Term
			evs = append(evs, ev{s.at, i, s.l.IsMaster})
		}
	}
	sort.SliceStable(evs, func(a, b int) bool { return evs[a].at.Before(evs[b].at) })
	masters := map[int]bool{}
	for _, e := range evs {
		masters[e.who] = e.master
		n := 0
		for _, m := range masters {
			if m {
				n++
			}
		}
		if n > 1 {
			t.Errorf("two masters at %v", e.at)
		}
	}
}

func others(rs []*replica, not *replica) []*replica {
	var out []*replica
	for _, r := range rs {
		if r != not {
			out = append(out, r)
		}
	}
	return out
}

func TestNewInvalid(t *testing.T) {
	c := &clientv3.Client{}
	for name, f := range map[string]func() (*Election, error){
		"nil client":    func() (*Election, error) { return New(nil, "/p") },
		"empty prefix":  func() (*Election, error) { return New(c, "") },
		"slash prefix":  func() (*Election, error) { return New(c, "//") },
		"zero TTL":      func() (*Election, error) { return New(c, "/p", WithTTL(0)) },
		"fraction TTL":  func() (*Election, error) { return New(c, "/p", WithTTL(1500*time.Millisecond)) },
		"negative":      func() (*Election, error) { return New(c, "/p", WithMargin(-time.Second)) },
		"margin >= 1/2": func() (*Election, error) { return New(c, "/p", WithTTL(2*time.Second), WithMargin(time.Second)) },
	} {
		if _, err := f(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	e, err := New(c, "/p")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Campaign(context.Background(), "", func(capacity.Leadership) {}); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("empty address: err = %v", err)
	}
}

// Three replicas elect one master; when it resigns another takes over at
// once, in a higher term.
func TestElectAndResign(t *testing.T) {
	srv := etcdtest.Start(t)
	var rs []*replica
	for i := range 3 {
		rs = append(rs, startReplica(t, srv.Endpoints[0], fmt.Sprintf("10.0.0.%d:7000", i+1)))
	}
	m := waitAgreed(t, 5*time.Second, rs...)
	term := m.last().Term
	if term <= 0 {
		t.Fatalf("term %d", term)
	}

	t0 := time.Now()
	m.stop()
	if l := m.last(); l.IsMaster {
		t.Fatalf("resigned master's last report %+v", l)
	}
	rest := others(rs, m)
	m2 := waitAgreed(t, 2*time.Second, rest...)
	t.Logf("new master %s after resignation: %v", m2.addr, time.Since(t0).Round(time.Millisecond))
	if m2.last().Term <= term {
		t.Fatalf("term %d after %d", m2.last().Term, term)
	}
	checkOneMaster(t, rs...)
}

// The master is cut off from etcd (as if its process froze or its host
// lost the network): it steps down before its lease can expire, and the
// other replica becomes master after the lease expires, never both at
// once.
func TestMasterCutOff(t *testing.T) {
	srv := etcdtest.Start(t)
	proxies := map[*replica]*faultproxy.Proxy{}
	var rs []*replica
	for i := range 3 {
		p := faultproxy.New(t, srv.Endpoints[0])
		r := startReplica(t, p.Endpoint, fmt.Sprintf("10.0.0.%d:7000", i+1))
		proxies[r] = p
		rs = append(rs, r)
	}
	m := waitAgreed(t, 5*time.Second, rs...)
	term := m.last().Term

	t0 := time.Now()
	proxies[m].Set(faultproxy.Hang)
	bound := m.lastBound()
	down := waitFor(t, testTTL, "step-down", func() bool { return !m.last().IsMaster })
	rest := others(rs, m)
	m2 := waitAgreed(t, testTTL+2*time.Second, rest...)
	up, _ := m2.firstAfter(t0, func(l capacity.Leadership) bool { return l.IsMaster })
	t.Logf("cut off at 0: old master stepped down at %v (%v before its earliest lease expiry), new master at %v",
		down.Sub(t0).Round(time.Millisecond), bound.Sub(down).Round(time.Millisecond), up.Sub(t0).Round(time.Millisecond))
	if !down.Before(bound) {
		t.Errorf("stepped down at %v, after the earliest expiry of its lease %v", down, bound)
	}
	if up.Sub(t0) > testTTL+time.Second {
		t.Errorf("new master after %v, want within TTL %v + 1s", up.Sub(t0), testTTL)
	}
	if m2.last().Term <= term {
		t.Fatalf("term %d after %d", m2.last().Term, term)
	}
	checkOneMaster(t, rs...)

	// Back in reach, the old master follows the new one.
	proxies[m].Set(faultproxy.Pass)
	waitAgreed(t, testTTL+2*time.Second, rs...)
	checkOneMaster(t, rs...)
}

// twoReplicas starts two replicas on srv and returns them and the master
// they agree on.
func twoReplicas(t *testing.T, srv *etcdtest.Server) ([]*replica, *replica) {
	t.Helper()
	rs := []*replica{
		startReplica(t, srv.Endpoints[0], "10.0.0.1:7000"),
		startReplica(t, srv.Endpoints[0], "10.0.0.2:7000"),
	}
	return rs, waitAgreed(t, 5*time.Second, rs...)
}

// etcd paused for longer than the TTL: the master steps down a margin
// before its lease could expire; after etcd resumes one master is elected.
func TestEtcdPausedLongerThanTTL(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.NeedOwn(t)
	rs, m := twoReplicas(t, srv)

	t0 := time.Now()
	srv.Pause(t)
	bound := m.lastBound()
	down := waitFor(t, testTTL, "step-down", func() bool { return !m.last().IsMaster })
	time.Sleep(time.Until(t0.Add(testTTL + 500*time.Millisecond)))
	srv.Resume(t)
	t.Logf("paused at 0 for %v: master stepped down at %v, %v before the earliest expiry of its lease",
		time.Since(t0).Round(time.Millisecond), down.Sub(t0).Round(time.Millisecond), bound.Sub(down).Round(time.Millisecond))
	if !down.Before(bound) {
		t.Errorf("stepped down at %v, after the earliest expiry of its lease %v", down, bound)
	}
	waitAgreed(t, testTTL+2*time.Second, rs...)
	t.Logf("one master again %v after the resume", time.Since(t0.Add(testTTL+500*time.Millisecond)).Round(time.Millisecond))
	checkOneMaster(t, rs...)
}

// A pause of half the TTL changes nothing.
func TestEtcdShortPause(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.NeedOwn(t)
	rs, _ := twoReplicas(t, srv)
	before := [][]stamped{rs[0].history(), rs[1].history()}
	srv.Pause(t)
	time.Sleep(testTTL / 2)
	srv.Resume(t)
	time.Sleep(testTTL / 2)
	for i, r := range rs {
		if got := r.history(); len(got) != len(before[i]) {
			t.Errorf("%s reported %+v during a pause of TTL/2", r.addr, got[len(before[i]):])
		}
	}
}

// etcd killed and restarted with its data: the master steps down while
// etcd is gone and the election recovers when it is back.
func TestEtcdKilledAndRestarted(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.NeedOwn(t)
	rs, m := twoReplicas(t, srv)
	term := m.last().Term

	t0 := time.Now()
	srv.Kill()
	down := waitFor(t, testTTL, "step-down", func() bool { return !m.last().IsMaster })
	srv.Restart(t)
	t1 := time.Now()
	m2 := waitAgreed(t, 2*testTTL, rs...)
	t.Logf("etcd killed at 0: master stepped down at %v; restarted at %v; one master (%s, term %d, was %s term %d) %v after the restart",
		down.Sub(t0).Round(time.Millisecond), t1.Sub(t0).Round(time.Millisecond),
		m2.addr, m2.last().Term, m.addr, term, time.Since(t1).Round(time.Millisecond))
	if m2.last().Term < term {
		t.Errorf("term went down: %d after %d", m2.last().Term, term)
	}
	checkOneMaster(t, rs...)
}

// The master's key deleted by hand: it steps down at once, the other
// replica takes over in a higher term, and the old master campaigns again.
// Both learn of the deletion from their watches, so the old master may
// still claim the older term for the time its watch takes: the term
// fences it (no lease margin can, as no lease expired).
func TestMasterKeyDeleted(t *testing.T) {
	srv := etcdtest.Start(t)
	rs, m := twoReplicas(t, srv)
	term := m.last().Term

	admin := newClient(t, srv.Endpoints[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g, err := admin.Get(ctx, "/test/"+t.Name()+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != m.addr {
		t.Fatalf("master key: %v %v", g, err)
	}
	t0 := time.Now()
	if _, err := admin.Delete(ctx, string(g.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	down := waitFor(t, time.Second, "step-down", func() bool { return !m.last().IsMaster })
	m2 := waitAgreed(t, 2*time.Second, rs...)
	t.Logf("key deleted at 0: master stepped down at %v, %s master in term %d (was %d) at %v",
		down.Sub(t0).Round(time.Millisecond), m2.addr, m2.last().Term, term, time.Since(t0).Round(time.Millisecond))
	if m2 == m || m2.last().Term <= term {
		t.Errorf("after the deletion: master %s term %d; before %s term %d", m2.addr, m2.last().Term, m.addr, term)
	}
	up, _ := m2.firstAfter(t0, func(l capacity.Leadership) bool { return l.IsMaster })
	t.Logf("overlap of the old term %d and the new term %d: %v", term, m2.last().Term, max(down.Sub(up), 0))
	if down.Sub(up) > 500*time.Millisecond {
		t.Errorf("old master stepped down %v after the new one took over", down.Sub(up))
	}
}
