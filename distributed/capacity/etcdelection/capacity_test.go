package etcdelection

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/etcdtest"
	"github.com/throttlekit/throttle/internal/faultproxy"
	"github.com/throttlekit/throttle/internal/testproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// capacityRig is three capacity servers electing a master on a real etcd,
// each through a fault proxy of its own, and clients reaching them over
// loopback HTTP, whose limiters a sampler sums every 2ms.
type capacityRig struct {
	t       *testing.T
	net     *capacity.HTTPTransport
	addrs   []string
	proxies map[string]*faultproxy.Proxy
	servers map[string]*capacity.Server
	res     []*capacity.Resource
	s       *testproc.Sampler
}

const rigCapacity = 100

// newCapacityRig starts the servers, each on an etcd client of the
// endpoints that endpoints returns for it.
func newCapacityRig(t *testing.T, endpoints func(g *capacityRig, addr string) []string) *capacityRig {
	g := &capacityRig{t: t, net: capacity.NewHTTPTransport(nil), proxies: map[string]*faultproxy.Proxy{},
		servers: map[string]*capacity.Server{}}
	cfg := capacity.Config{Resources: []capacity.Template{{ID: "*", Capacity: rigCapacity, LeaseLength: 2 * time.Second, RefreshInterval: 500 * time.Millisecond}}}
	for range 3 {
		hs := httptest.NewUnstartedServer(nil)
		t.Cleanup(hs.Close)
		addr := hs.Listener.Addr().String()
		cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints(g, addr), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		e, err := New(cl, "/test/"+t.Name(), WithTTL(testTTL))
		if err != nil {
			t.Fatal(err)
		}
		s, err := capacity.NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs.Config.Handler = capacity.NewHandler(s)
		hs.Start()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx, e, addr) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run = %v", addr, err)
			}
		})
		g.addrs, g.servers[addr] = append(g.addrs, addr), s
	}
	return g
}

// proxied gives each server a fault proxy of its own to srv.
func proxied(srv *etcdtest.Server) func(g *capacityRig, addr string) []string {
	return func(g *capacityRig, addr string) []string {
		p := faultproxy.New(g.t, srv.Endpoints[0])
		g.proxies[addr] = p
		return []string{p.Endpoint}
	}
}

// client opens "db" wanting wants on a new Pessimistic client.
func (g *capacityRig) client(id string, wants float64) {
	c, err := capacity.NewClient(g.net, g.addrs, capacity.WithClientID(id), capacity.WithMode(capacity.Pessimistic),
		capacity.WithRetry(50*time.Millisecond), capacity.WithRequestTimeout(300*time.Millisecond), capacity.WithMinRefreshGap(0))
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	r, err := c.Resource("db", wants)
	if err != nil {
		g.t.Fatal(err)
	}
	g.res = append(g.res, r)
}

// sample starts summing what the clients enforce every 2ms.
func (g *capacityRig) sample() {
	g.s = testproc.Sample(2*time.Millisecond, rigCapacity, func() float64 {
		var sum float64
		for _, r := range g.res {
			sum += r.Capacity()
		}
		return sum
	})
}

// master returns the address of the server that is master, "" if none
// or more than one says it is.
func (g *capacityRig) master() string {
	m := ""
	for addr, s := range g.servers {
		if s.Status().Leadership.IsMaster {
			if m != "" {
				return ""
			}
			m = addr
		}
	}
	return m
}

// settled waits until one server is master and the clients hold
// rigCapacity between them.
func (g *capacityRig) settled(what string) string {
	g.t.Helper()
	var m string
	waitFor(g.t, 4*testTTL, what, func() bool {
		var sum float64
		for _, r := range g.res {
			sum += r.Capacity()
		}
		m = g.master()
		return m != "" && sum > rigCapacity-1e-9
	})
	return m
}

func (g *capacityRig) end() {
	worst, over := g.s.Stop()
	g.t.Logf("worst Σ enforced %v of %v", worst, rigCapacity)
	if len(over) > 0 {
		g.t.Errorf("Σ enforced above %v for %v", rigCapacity, over)
	}
}

// TestFaultEtcdUnderCapacity: three capacity servers elect their master
// on a real etcd while three clients share 100; etcd is killed and
// restarted (the leader of a one-member cluster), answers the master
// slowly (each answer 1s late, a third of the TTL), and is cut off from
// the master but not from the clients. Sampled every 2ms, what the
// clients enforce adds up to at most 100, and the servers settle on one
// master serving the whole capacity after each fault.
func TestFaultEtcdUnderCapacity(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.NeedOwn(t)
	g := newCapacityRig(t, proxied(srv))
	for _, id := range []string{"a", "b", "c"} {
		g.client(id, 50)
	}
	g.settled("the first master shares 100")
	g.sample()
	defer g.end()

	g.s.Step("etcd killed")
	srv.Kill()
	time.Sleep(testTTL / 2)
	srv.Restart(t)
	g.s.Step("etcd restarted")
	g.settled("one master after etcd's restart")

	m := g.master()
	g.s.Step("etcd slow to the master")
	g.proxies[m].Set(faultproxy.LateAnswers(time.Second))
	time.Sleep(testTTL)
	g.proxies[m].Set(faultproxy.Pass)
	g.settled("one master after etcd was slow")

	m = g.master()
	g.s.Step("etcd cut off from the master")
	g.proxies[m].Set(faultproxy.Hang)
	waitFor(t, 2*testTTL, "another master", func() bool { n := g.master(); return n != "" && n != m })
	g.settled("the new master shares 100")
	g.proxies[m].Set(faultproxy.Pass)
	g.s.Step("healed")
	time.Sleep(testTTL / 2)
}

// TestFaultEtcdLeaderKilled: the capacity servers elect their master on a
// cluster of three etcd members, each server a client of all three; the
// etcd leader is killed, then restarted. The cluster keeps a quorum, so
// the master keeps its session or hands over, never to two masters:
// sampled every 2ms, what three clients enforce adds up to at most 100,
// and one master serves the whole capacity after each step.
func TestFaultEtcdLeaderKilled(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	g := newCapacityRig(t, func(*capacityRig, string) []string { return c.Endpoints })
	for _, id := range []string{"a", "b", "c"} {
		g.client(id, 50)
	}
	g.settled("the first master shares 100")
	g.sample()
	defer g.end()
	for range 2 {
		l := c.Leader(t, 5*time.Second)
		g.s.Step("etcd leader " + l.Endpoints[0] + " killed")
		l.Kill()
		g.settled("one master after the etcd leader was killed")
		time.Sleep(testTTL)
		g.settled("one master a TTL later")
		l.Restart(t)
		g.s.Step("etcd member " + l.Endpoints[0] + " restarted")
		g.settled("one master after the member's restart")
	}
}
