package capacity

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
)

// treeNode is one server of a test tree on a memNetwork.
type treeNode struct{ addr, parent string }

// newTree starts servers of cfg on net, children asking their parent;
// they are closed when the test ends.
func newTree(t *testing.T, net *memNetwork, cfg Config, nodes []treeNode, opts ...ServerOption) map[string]*Server {
	t.Helper()
	out := map[string]*Server{}
	for _, n := range nodes {
		o := append([]ServerOption{withSeed(uint64(len(out) + 1))}, opts...)
		if n.parent != "" {
			o = append(o, WithParent(net, []string{n.parent}, WithClientID(n.addr), WithMinRefreshGap(0)))
		}
		s, err := NewServer(cfg, o...)
		if err != nil {
			t.Fatal(err)
		}
		net.Attach(n.addr, s)
		out[n.addr] = s
		t.Cleanup(func() { s.Close() })
	}
	return out
}

// TestTreeHugeWants: two clients of a leaf asking 1e308 each (finite, but
// their sum is +Inf) neither cut the leaf off from its parent for its
// other resources nor make the tree's leases exceed the root's capacity:
// sampled every 100 ms, the leases the clients hold on "db" add up to at
// most 120.
func TestTreeHugeWants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity = 120.0
		net := new(memNetwork)
		net.SetLatency(5 * time.Millisecond)
		cfg := Config{Resources: []Template{{ID: "*", Capacity: capacity, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second, SafeCapacity: 60}}}
		servers := newTree(t, net, cfg, []treeNode{{"root", ""}, {"l0", "root"}, {"l1", "root"}}, WithDecreaseGrace(10*time.Second))
		open := func(leaf, id, res string, wants float64) *Resource {
			return openResource(t, dialClient(t, net, []string{leaf}, WithClientID(id), WithMinRefreshGap(0)), res, wants)
		}
		a, b := open("l0", "a", "db", 50), open("l0", "b", "db", 50)
		other := open("l0", "c", "other", 10)
		d := open("l1", "d", "db", 10)
		worst := 0.0
		for step := range 900 { // 90 s
			switch step {
			case 300:
				if err := a.SetWants(1e308); err != nil {
					t.Fatal(err)
				}
				if err := b.SetWants(1e308); err != nil {
					t.Fatal(err)
				}
				if err := d.SetWants(capacity); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			sum := 0.0
			for _, r := range []*Resource{a, b, d} {
				sum += r.Capacity() // what the client's limiter enforces now
			}
			worst = max(worst, sum)
			if sum > capacity+1e-9 {
				t.Fatalf("t=%v: clients use %.2f of db's %v", time.Duration(step+1)*100*time.Millisecond, sum, capacity)
			}
		}
		if l, ok := other.Lease(); !ok || l.Capacity != 10 {
			t.Errorf("the leaf's other resource: lease %+v %v, want 10 from the parent", l, ok)
		}
		if err := servers["l0"].ParentErr(); err != nil {
			t.Errorf("the parent refuses the leaf: %v", err)
		}
		t.Logf("clients used at most %.2f of %v", worst, capacity)
	})
}

// TestClientLeavesOutInvalidDemand: a resource whose demand a server would
// refuse stays out of the client's request, with an error of its own; the
// client's other resources are still leased.
func TestClientLeavesOutInvalidDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, n := warmServer(t, 100)
		c := newClient(t, n, "a", WithMinRefreshGap(0))
		good := openResource(t, c, "r", 10)
		bad := openResource(t, c, "s", 1)
		bad.setDemand(math.Inf(1), 1, 0) // only a server in a tree sets demands unchecked
		time.Sleep(10 * time.Second)
		if l, ok := good.Lease(); !ok || l.Capacity != 10 || good.Err() != nil {
			t.Errorf("good resource: lease %+v %v, err %v", l, ok, good.Err())
		}
		if err := bad.Err(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("bad resource: err %v, want ErrInvalid", err)
		}
		if err := c.Err(); err != nil {
			t.Errorf("client: %v", err)
		}
	})
}

// TestParentErrReportsRefusal: a parent that refuses a leaf shows in the
// leaf's ParentErr, with the parent's sentinel.
func TestParentErrReportsRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := new(memNetwork)
		cfg := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
		root, err := NewServer(cfg, WithMaxResources(1))
		if err != nil {
			t.Fatal(err)
		}
		net.Attach("root", root)
		leaf := newTree(t, net, cfg, []treeNode{{"leaf", "root"}})["leaf"]
		ask(t, leaf, "c", ResourceRequest{Resource: "x", Wants: 1}, ResourceRequest{Resource: "y", Wants: 1})
		time.Sleep(5 * time.Second)
		if err := leaf.ParentErr(); !errors.Is(err, ErrExhausted) {
			t.Fatalf("ParentErr %v, want ErrExhausted", err)
		}
		net.SetDown("root", true)
		time.Sleep(20 * time.Second)
		if err := leaf.ParentErr(); !errors.Is(err, throttle.ErrUnavailable) {
			t.Fatalf("ParentErr %v, want ErrUnavailable", err)
		}
	})
}

// TestUnheldResourcesAreDropped: made-up resource ids whose leases have
// expired are forgotten, so that they do not fill the bound of resources
// for good.
func TestUnheldResourcesAreDropped(t *testing.T) {
	s, clk := newTestServer(t, testConfig(100), WithMaxResources(10))
	var rrs []ResourceRequest
	for i := range 10 {
		rrs = append(rrs, ResourceRequest{Resource: fmt.Sprintf("made-up-%d", i), Wants: 1})
	}
	ask(t, s, "attacker", rrs...)
	if _, err := s.GetCapacity(t.Context(), &Request{Client: "a", Resources: []ResourceRequest{{Resource: "r", Wants: 1}}}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("at the bound: %v, want ErrExhausted", err)
	}
	clk.Advance(counts(defaultLeaseLength)) // the attacker's leases expire
	s.Status()                              // finds the made-up resources unheld
	clk.Advance(dropInterval)
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 1}); len(g) != 1 {
		t.Fatalf("grants %+v", g)
	}
	if n := len(s.Status().Resources); n != 1 {
		t.Fatalf("%d resources tracked, want 1", n)
	}
	ask(t, s, "b", ResourceRequest{Resource: "s", Wants: 1})
	if _, err := s.Release(t.Context(), &ReleaseRequest{Client: "b", Resources: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(dropInterval)
	s.Status()
	clk.Advance(dropInterval)
	if n := len(s.Status().Resources); n != 1 {
		t.Fatalf("%d resources tracked after a release, want 1", n)
	}
}

// TestTreeNewResourceStartsEmpty: a leaf past its learning divides only
// what its parent granted, also for a resource it has not asked its
// parent for yet: its first grant is 0, not its template's capacity.
func TestTreeNewResourceStartsEmpty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := new(memNetwork)
		root, err := NewServer(Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}})
		if err != nil {
			t.Fatal(err)
		}
		net.Attach("root", root)
		leafCfg := Config{Resources: []Template{{ID: "*", Capacity: 1000, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
		leaf := newTree(t, net, leafCfg, []treeNode{{"leaf", "root"}})["leaf"]
		time.Sleep(20 * time.Second) // both past learning
		if g := ask(t, leaf, "c", ResourceRequest{Resource: "x", Wants: 50}); g[0].Capacity != 0 {
			t.Fatalf("first grant %v of a resource the parent has granted nothing of yet", g[0].Capacity)
		}
		for range 10 {
			time.Sleep(time.Second)
			if g := ask(t, leaf, "c", ResourceRequest{Resource: "x", Wants: 50}); g[0].Capacity > 10 {
				t.Fatalf("grant %v above the root's capacity 10", g[0].Capacity)
			}
		}
	})
}

// TestLeaseBounds: the client leases of a server are bounded in all and
// per client id: a request beyond fails with ErrExhausted and changes
// nothing, one client at its own bound leaves room to the others, and
// expired leases free their places.
func TestLeaseBounds(t *testing.T) {
	s, clk := newTestServer(t, testConfig(100), WithMaxLeases(5, 3))
	req := func(client string, ids ...string) error {
		var rrs []ResourceRequest
		for _, id := range ids {
			rrs = append(rrs, ResourceRequest{Resource: id, Wants: 1})
		}
		_, err := s.GetCapacity(t.Context(), &Request{Client: client, Resources: rrs})
		return err
	}
	if err := req("greedy", "a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	if err := req("greedy", "d"); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), `client "greedy"`) {
		t.Fatalf("beyond the bound per client: %v", err)
	}
	if err := req("greedy", "a", "b", "c"); err != nil {
		t.Fatalf("refreshing what it holds: %v", err)
	}
	if err := req("other", "a", "e"); err != nil {
		t.Fatalf("another client: %v", err)
	}
	if err := req("third", "a"); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "in all") {
		t.Fatalf("beyond the bound in all: %v", err)
	}
	if n := len(s.Status().Resources); n != 4 {
		t.Fatalf("a refused request changed the state: %d resources", n)
	}
	clk.Advance(counts(defaultLeaseLength) + dropInterval)
	if err := req("third", "a", "b", "c"); err != nil {
		t.Fatalf("after the leases expired: %v", err)
	}
	if _, err := NewServer(testConfig(1), WithMaxLeases(0, 1)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("bad bound: %v", err)
	}
}

// bandClients returns how many clients a server in a tree runs at its
// parent, and in how many bands.
func bandClients(s *Server) (clients, bands int) {
	s.parent.mu.Lock()
	defer s.parent.mu.Unlock()
	for _, cs := range s.parent.band {
		clients += len(cs)
	}
	return clients, len(s.parent.band)
}

// TestTreeBandsBounded: clients in ever new priority bands start at most
// maxParentBands clients at the parent (a request in one more band is
// refused and changes nothing), and the bands they leave are closed, so
// that no upstream client outlives its clients.
func TestTreeBandsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		servers := rootAndLeaf(t)
		leaf := servers["leaf"]
		refused := 0
		for p := range int32(100) {
			_, err := leaf.GetCapacity(t.Context(), &Request{Client: fmt.Sprint("c", p), Resources: []ResourceRequest{{Resource: "db", Wants: 1, Priority: p}}})
			switch {
			case errors.Is(err, ErrExhausted):
				refused++
			case err != nil:
				t.Fatal(err)
			}
		}
		if c, b := bandClients(leaf); b > maxParentBands || c > maxParentBands || refused != 100-maxParentBands {
			t.Fatalf("%d clients in %d bands at the parent, %d requests refused; want at most %d bands", c, b, refused, maxParentBands)
		}
		if st := leaf.Status(); st.Resources[0].Clients != maxParentBands {
			t.Fatalf("refused requests changed the state: %d clients", st.Resources[0].Clients)
		}
		time.Sleep(60 * time.Second) // the clients are gone
		if c, b := bandClients(leaf); c > 1 || b > 1 {
			t.Fatalf("%d clients in %d bands at the parent after every client left", c, b)
		}
		if n := leased(root(servers)); n != 0 {
			t.Fatalf("the root still leases %d resources", n)
		}
		if _, err := leaf.GetCapacity(t.Context(), &Request{Client: "late", Resources: []ResourceRequest{{Resource: "db", Wants: 1, Priority: 99}}}); err != nil {
			t.Fatalf("a newcomer in a new band: %v", err)
		}
	})
}

func root(servers map[string]*Server) *Server { return servers["root"] }

// rootAndLeaf starts a root of capacity 100 and a leaf under it.
func rootAndLeaf(t *testing.T) map[string]*Server {
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
	return newTree(t, new(memNetwork), cfg, []treeNode{{"root", ""}, {"leaf", "root"}})
}

// leased returns how many of s's resources have clients.
func leased(s *Server) int {
	n := 0
	for _, r := range s.Status().Resources {
		if r.Clients > 0 {
			n++
		}
	}
	return n
}

// TestTreeManyResources: a leaf serves more resources at once than one
// request to its parent carries, and ever new ones over its lifetime.
func TestTreeManyResources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		servers := rootAndLeaf(t)
		leaf := servers["leaf"]
		batch := func(round, client int) []ResourceRequest {
			rrs := make([]ResourceRequest, 600)
			for i := range rrs {
				rrs[i] = ResourceRequest{Resource: fmt.Sprintf("r%d-%d-%d", round, client, i), Wants: 1}
			}
			return rrs
		}
		for round := range 2 { // 2400 ids in all, 1200 at once
			for client := range 2 {
				if _, err := leaf.GetCapacity(t.Context(), &Request{Client: fmt.Sprint("c", client), Resources: batch(round, client)}); err != nil {
					t.Fatalf("round %d client %d: %v", round, client, err)
				}
			}
			time.Sleep(5 * time.Second)
			if n := leased(root(servers)); n != 1200 {
				t.Fatalf("round %d: the root leases %d resources to the leaf, want 1200", round, n)
			}
			time.Sleep(30 * time.Second) // the clients leave
		}
	})
}
