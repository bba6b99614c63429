package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/etcdtest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// cuttable is a Transport whose calls fail while cut, as for a client
// that has lost its network.
type cuttable struct {
	capacity.Transport
	cut atomic.Bool
}

func (c *cuttable) GetCapacity(ctx context.Context, addr string, req *capacity.Request) (*capacity.Response, error) {
	if c.cut.Load() {
		return nil, fmt.Errorf("%w: cut off", throttle.ErrUnavailable)
	}
	return c.Transport.GetCapacity(ctx, addr, req)
}

func (c *cuttable) Release(ctx context.Context, addr string, req *capacity.ReleaseRequest) (*capacity.Response, error) {
	if c.cut.Load() {
		return nil, fmt.Errorf("%w: cut off", throttle.ErrUnavailable)
	}
	return c.Transport.Release(ctx, addr, req)
}

// sumCapacity is what the limiters of rs enforce now, added up; each
// is also asked for a unit, as by a client under load.
func sumCapacity(rs []*capacity.RateResource) func() float64 {
	return func() float64 {
		var sum float64
		for _, r := range rs {
			sum += r.Capacity()
			r.Allow(context.Background(), "", 1)
		}
		return sum
	}
}

// TestProcessTreeRestart runs a tree of capacityd processes: a root of
// 120 and two leaves; on leaf 1 c1 wants 10 and c2 110, on leaf 2 d1
// wants 120 (shares 10, 55, 55). With c2 cut off and enforcing its
// unexpired lease, leaf 1 is killed (SIGKILL) and restarted on its
// address, so under the same id at the root; then the root is. Sampled
// every 2ms, what the clients' limiters enforce adds up to at most 120.
func TestProcessTreeRestart(t *testing.T) {
	hc := newHTTPClient(t)
	const lease = 3 * time.Second // long beside a restart, as in production
	res := `"resources": [{"id": "*", "capacity": 120, "lease_length": "` + lease.String() + `", "refresh_interval": "500ms"}]`
	rootCfg := `{"listen": "API", "admin": "ADMIN", ` + res + `}`
	root := startProc(t, hc, rootCfg)
	leafCfg := `{"listen": "API", "admin": "ADMIN", "parent": ["` + root.api + `"], ` + res + `}`
	leaf1 := startProc(t, hc, leafCfg)
	leaf2 := startProc(t, hc, leafCfg)
	time.Sleep(lease) // all three learn

	rs, cuts := treeClients(t, hc, leaf1, leaf2)
	settledShares(t, rs, "start")
	s := testproc.Sample(2*time.Millisecond, 120, sumCapacity(rs))
	defer checkSampler(t, s, 120)
	for _, step := range []struct {
		name string
		p    **proc
		cfg  string
	}{{"leaf 1", &leaf1, leafCfg}, {"root", &root, rootCfg}} {
		s.Step(step.name + " killed, c2 cut off")
		cuts["c2"].cut.Store(true)
		(*step.p).Kill()
		time.Sleep(300 * time.Millisecond)
		*step.p = restartProc(t, hc, *step.p, step.cfg)
		s.Step(step.name + " restarted, c2 cut off")
		time.Sleep(lease) // c2's lease expires
		if h := health(hc, *step.p); !strings.HasPrefix(h, "200") {
			t.Errorf("%s after restart: /healthz %s", step.name, h)
		}
		cuts["c2"].cut.Store(false)
		s.Step(step.name + " restarted, c2 back")
		settledShares(t, rs, step.name+" restarted")
	}
}

// treeClients starts the clients of the tree tests, c1 (wants 10) and c2
// (110) on leaf1 and d1 (120) on leaf2, in Pessimistic mode, each on a
// transport of its own that the test can cut.
func treeClients(t *testing.T, hc *http.Client, leaf1, leaf2 *proc) ([]*capacity.RateResource, map[string]*cuttable) {
	t.Helper()
	var rs []*capacity.RateResource
	cuts := map[string]*cuttable{}
	for _, c := range []struct {
		id    string
		leaf  *proc
		wants float64
	}{{"c1", leaf1, 10}, {"c2", leaf1, 110}, {"d1", leaf2, 120}} {
		tr := &cuttable{Transport: capacity.NewHTTPTransport(hc, connect.WithProtoJSON())}
		cuts[c.id] = tr
		cl, err := capacity.NewClient(tr, []string{c.leaf.api}, capacity.WithClientID(c.id), capacity.WithMode(capacity.Pessimistic),
			capacity.WithRetry(50*time.Millisecond), capacity.WithRequestTimeout(500*time.Millisecond), capacity.WithMinRefreshGap(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		r, err := cl.Rate("db", c.wants)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs, cuts
}

// settledShares waits until the tree clients hold 10, 55 and 55.
func settledShares(t *testing.T, rs []*capacity.RateResource, step string) {
	t.Helper()
	eventually(t, step+": shares 10, 55, 55", func() bool {
		for i, w := range []float64{10, 55, 55} {
			if math.Abs(rs[i].Capacity()-w) > 0.01 {
				return false
			}
		}
		return true
	})
}

// checkSampler stops s and fails t if the sum went above bound.
func checkSampler(t *testing.T, s *testproc.Sampler, bound float64) {
	t.Helper()
	worst, over := s.Stop()
	t.Logf("worst Σ enforced %v (bound %v)", worst, bound)
	if len(over) > 0 {
		t.Errorf("Σ enforced above %v: worst %v, for %v", bound, worst, over)
	}
}

// TestProcessTreeEtcdRoot: the root of the tree is two capacityd replicas
// electing their master on a real etcd, the leaves ask both. With c2 cut
// off, the root's master is killed (SIGKILL); the other replica takes
// over and learns, the killed one restarts and follows. Sampled every
// 2ms, what the clients' limiters enforce adds up to at most 120.
func TestProcessTreeEtcdRoot(t *testing.T) {
	etcd := etcdtest.Start(t)
	hc := newHTTPClient(t)
	const lease = 3 * time.Second
	res := `"resources": [{"id": "*", "capacity": 120, "lease_length": "` + lease.String() + `", "refresh_interval": "500ms"}]`
	rootCfg := `{"listen": "API", "admin": "ADMIN", "etcd": {"endpoints": ["` + strings.Join(etcd.Endpoints, `","`) + `"],
		"prefix": "/capacityd-test/` + t.Name() + `", "ttl": "2s"}, ` + res + `}`
	a := startProc(t, hc, rootCfg)
	eventually(t, "a is the master", func() bool { return strings.HasPrefix(health(hc, a), "200 ok master") })
	b := startProc(t, hc, rootCfg)
	eventually(t, "b follows a", func() bool { return strings.HasPrefix(health(hc, b), "200 ok follower of "+a.api) })
	leafCfg := `{"listen": "API", "admin": "ADMIN", "parent": ["` + a.api + `","` + b.api + `"], ` + res + `}`
	leaf1 := startProc(t, hc, leafCfg)
	leaf2 := startProc(t, hc, leafCfg)
	time.Sleep(lease) // all learn
	rs, cuts := treeClients(t, hc, leaf1, leaf2)
	settledShares(t, rs, "start")
	s := testproc.Sample(2*time.Millisecond, 120, sumCapacity(rs))
	defer checkSampler(t, s, 120)

	s.Step("root master killed, c2 cut off")
	cuts["c2"].cut.Store(true)
	a.Kill()
	eventually(t, "b takes over", func() bool { return strings.HasPrefix(health(hc, b), "200 ok master") })
	a = restartProc(t, hc, a, rootCfg)
	s.Step("b master, a restarted, c2 cut off")
	eventually(t, "a follows b", func() bool { return strings.HasPrefix(health(hc, a), "200 ok follower of "+b.api) })
	time.Sleep(lease) // c2's lease expires
	cuts["c2"].cut.Store(false)
	s.Step("c2 back")
	settledShares(t, rs, "b master")
}
