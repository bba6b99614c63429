package capacity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// treeConfig is the setting of the restart tests: root capacity 120,
// leases of 10s refreshed every 2s.
func treeConfig() Config {
	return Config{Resources: []Template{{ID: "*", Capacity: 120, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
}

// leaf starts a server at addr leasing from root under the client id addr.
func (g *rig) leaf(addr string, opts ...ClientOption) *Server {
	g.t.Helper()
	s, _ := g.server(addr, g.cfg, nil, WithParent(g.net, []string{"root"}, append([]ClientOption{WithClientID(addr), WithMinRefreshGap(0)}, opts...)...))
	return s
}

// restartTree starts the tree: a root of 120 and two leaves past
// learning; on leaf1 c1 wants 10 and c2 110, on leaf2 d1 wants 120, and
// the shares settle at 10, 55 and 55.
func restartTree(g *rig) (root, leaf1 *Server) {
	root, _ = g.server("root", g.cfg, nil)
	leaf1 = g.leaf("leaf1")
	g.leaf("leaf2")
	time.Sleep(g.cfg.Resources[0].LeaseLength) // all three learn
	g.client("c1", []string{"leaf1"}, 10)
	g.client("c2", []string{"leaf1"}, 110)
	g.client("d1", []string{"leaf2"}, 120)
	g.run("steady", 30*time.Second)
	return root, leaf1
}

// TestFaultTreeLeafRestart: leaf1 crashes and, 2s later, restarts under
// the same client id at the root, while c2 has lost its network and keeps
// enforcing its unexpired lease of 55 from leaf1's previous life. The
// restarted leaf knows only c1; the root must go on counting what it
// granted leaf1's previous life until that lease has expired, and never
// take what the new life reports as confirming it lower: otherwise it
// grants leaf2 110 while c2 still enforces 55 (Σ 165 of 120).
func TestFaultTreeLeafRestart(t *testing.T) {
	scenario(t, treeConfig(), 120, func(g *rig) {
		_, leaf1 := restartTree(g)
		g.net.Cut("c2", true)
		g.net.SetDown("leaf1", true)
		leaf1.abandon() // crashed: it gives nothing back
		g.run("leaf1 down, c2 cut off", 2*time.Second)
		g.leaf("leaf1") // restarted, its state lost
		g.net.SetDown("leaf1", false)
		g.run("leaf1 restarted, c2 cut off", 30*time.Second)
		g.net.Cut("c2", false)
		g.run("c2 back", 40*time.Second)
		g.settled(10, 55, 55)
	})
}

// settled checks that the clients, in order, hold the leases want.
func (g *rig) settled(want ...float64) {
	g.t.Helper()
	var got []float64
	for i := range want {
		l, _ := g.res[i].Lease()
		got = append(got, l.Capacity)
	}
	for i, w := range want {
		if math.Abs(got[i]-w) > 0.01 {
			g.t.Errorf("clients hold %v, want %v", got, want)
			return
		}
	}
}

// TestFaultTreeRootRestart: the root crashes and restarts at once, its
// state lost, while c2 is cut off: the new root learns for a lease
// length, confirming only what the leaves report, so c2's unreported 55
// has expired before it divides again.
func TestFaultTreeRootRestart(t *testing.T) {
	scenario(t, treeConfig(), 120, func(g *rig) {
		restartTree(g)
		g.net.Cut("c2", true)
		g.server("root", g.cfg, nil) // restarted, its state lost
		g.run("root restarted, c2 cut off", 30*time.Second)
		g.net.Cut("c2", false)
		g.run("c2 back", 40*time.Second)
		g.settled(10, 55, 55)
	})
}

// TestReleaseKeepsOldIncarnation: a release from a new incarnation of a
// client gives back its own lease, not what its previous life may still
// hold; a call of the old life after the new one's is stale.
func TestReleaseKeepsOldIncarnation(t *testing.T) {
	s, clk := pastLearning(t, 100)
	get := func(client string, inc int64, wants float64) *Response {
		t.Helper()
		resp, err := s.GetCapacity(context.Background(), &Request{Client: client, Incarnation: inc, Sequence: 1, Resources: []ResourceRequest{{Resource: "r", Wants: wants}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if g := get("a", 1, 100).Grants[0]; g.Capacity != 100 {
		t.Fatalf("a's first life got %v", g.Capacity)
	}
	if g := get("a", 2, 100).Grants[0]; g.Capacity != 0 {
		t.Fatalf("a's second life got %v while its first may hold 100", g.Capacity)
	}
	if _, err := s.Release(context.Background(), &ReleaseRequest{Client: "a", Resources: []string{"r"}, Incarnation: 2, Sequence: 2}); err != nil {
		t.Fatal(err)
	}
	if held(s, "r") != 100 {
		t.Fatalf("held %v after the second life's release, want the first life's 100", held(s, "r"))
	}
	if r := get("a", 1, 100); !r.Stale {
		t.Fatalf("a call of the first life after the second's: %+v", r)
	}
	clk.Advance(counts(20 * time.Second)) // the first life's lease expires
	if g := get("b", 1, 100).Grants[0]; g.Capacity != 100 {
		t.Fatalf("b got %v once the old lease expired", g.Capacity)
	}
}

// TestFaultRandomRestarts runs the tree under random schedules of
// crashes and restarts (leaves, the root, clients, all under their ids),
// clients cut off and healed, their answers lost or late and their calls
// held up, and changes of wants, one event every 1 to 6s for 3 minutes
// per seed, on virtual time. Σ enforced, sampled every
// 10ms, stays within 120 throughout.
func TestFaultRandomRestarts(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			scenario(t, treeConfig(), 120, func(g *rig) {
				rng := rand.New(rand.NewPCG(seed, 37))
				servers := map[string]*Server{}
				servers["root"], _ = g.server("root", g.cfg, nil)
				for _, l := range []string{"leaf1", "leaf2"} {
					servers[l] = g.leaf(l)
				}
				time.Sleep(g.cfg.Resources[0].LeaseLength)
				type cl struct {
					id, leaf string
					c        *Client
					r        *RateResource
				}
				var cls []*cl
				for i, leaf := range []string{"leaf1", "leaf1", "leaf2", "leaf2"} {
					x := &cl{id: fmt.Sprint("c", i), leaf: leaf}
					x.c, x.r = g.clientVia(g.net, x.id, []string{leaf}, float64(10+rng.IntN(110)))
					cls = append(cls, x)
				}
				for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); {
					step := g.randomStep(rng, servers, func(i int) (*Client, string, string) { return cls[i].c, cls[i].id, cls[i].leaf },
						func(i int, c *Client, r *RateResource) { cls[i].c, cls[i].r = c, r }, len(cls))
					g.run(step, time.Duration(1000+rng.IntN(5000))*time.Millisecond)
				}
				for _, x := range cls {
					g.net.Cut(x.id, false)
					g.net.set(x.id, fault{})
				}
				g.run("healed", 20*time.Second)
			})
		})
	}
}

// randomStep applies one random fault or change to the tree and returns
// its name. A crashed server or client is restarted, its state lost,
// after up to 3s.
func (g *rig) randomStep(rng *rand.Rand, servers map[string]*Server, client func(int) (*Client, string, string), set func(int, *Client, *RateResource), n int) string {
	i := rng.IntN(n)
	c, id, leaf := client(i)
	switch rng.IntN(6) {
	case 0, 1:
		addr := []string{"leaf1", "leaf2", "root"}[rng.IntN(3)]
		g.net.SetDown(addr, true)
		servers[addr].abandon()
		g.run(addr+" down", time.Duration(rng.IntN(3000))*time.Millisecond)
		if addr == "root" {
			servers[addr], _ = g.server(addr, g.cfg, nil)
		} else {
			servers[addr] = g.leaf(addr)
		}
		g.net.SetDown(addr, false)
		return addr + " restarted"
	case 2:
		c.abandon()
		g.run(id+" down", time.Duration(rng.IntN(3000))*time.Millisecond)
		nc, err := NewClient(g.net, []string{leaf}, WithClientID(id), WithMode(g.mode))
		if err != nil {
			g.t.Fatal(err)
		}
		g.closers = append(g.closers, func() { nc.Close() })
		set(i, nc, g.rate(nc, float64(rng.IntN(130))))
		return id + " restarted"
	case 3:
		cut := rng.IntN(2) == 0
		g.net.Cut(id, cut)
		return fmt.Sprintf("%s cut %v", id, cut)
	case 4:
		f := []fault{{}, {drop: true}, {late: time.Duration(rng.IntN(6000)) * time.Millisecond}, {slowIn: time.Duration(rng.IntN(8000)) * time.Millisecond}}[rng.IntN(4)]
		g.net.set(id, f)
		return fmt.Sprintf("%s's calls %+v", id, f)
	}
	c.mu.Lock()
	var r *Resource
	for _, x := range c.res {
		r = x
	}
	c.mu.Unlock()
	if r != nil {
		_ = r.SetWants(float64(rng.IntN(130)))
	}
	return id + " wants changed"
}

// TestFaultTreeLeafDownToZero: a on leaf1 and b on leaf2 share the root's
// 100; a then wants nothing, but the answers to it are lost, so a keeps
// enforcing its 50 until its lease expires. leaf1 lowers a to 0 and
// wants 0 of the root, which lowers leaf1 to 0. leaf1 must go on
// reporting the 50 that a may hold, although it has no capacity left to
// count in, so that the root does not give b 100 meanwhile.
func TestFaultTreeLeafDownToZero(t *testing.T) {
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
	scenario(t, cfg, 100, func(g *rig) {
		g.server("root", g.cfg, nil)
		g.leaf("leaf1")
		g.leaf("leaf2")
		time.Sleep(g.cfg.Resources[0].LeaseLength)
		a := g.client("a", []string{"leaf1"}, 100)
		g.client("b", []string{"leaf2"}, 100)
		g.run("a and b", 20*time.Second)
		g.settled(50, 50)
		g.net.set("a", fault{drop: true})
		if err := a.SetWants(0); err != nil {
			g.t.Fatal(err)
		}
		g.run("a wants 0, the answers to it lost", 20*time.Second)
		g.heal("a", 10*time.Second)
		g.settled(0, 100)
	})
}
