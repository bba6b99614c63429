package capacity

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// skewed is a host clock set d away from the others, running at the
// same rate.
type skewed time.Duration

func (d skewed) Now() time.Time { return time.Now().Add(time.Duration(d)) }

// TestFaultClockSkew: the servers' and clients' clocks are set hours
// apart, and steps of a wall clock only move the incarnation of a process
// started after them. Σ enforced stays within the capacity.
func TestFaultClockSkew(t *testing.T) {
	// The issue's tree with the root an hour ahead and leaf 1 an hour
	// behind; leaf 1 restarts on a clock stepped back two hours, so its
	// new incarnation is older than its previous life's: the root answers
	// it stale once, it moves past, and the root counts the previous
	// life's grant until it expires.
	t.Run("tree", func(t *testing.T) {
		scenario(t, treeConfig(), 120, func(g *rig) {
			leafOpts := func(d time.Duration, opts ...ClientOption) []ServerOption {
				return []ServerOption{WithServerClock(skewed(d)), WithParent(g.net, []string{"root"},
					append([]ClientOption{WithClientID("leaf1"), WithMinRefreshGap(0)}, opts...)...)}
			}
			g.server("root", g.cfg, nil, WithServerClock(skewed(time.Hour)))
			leaf1, _ := g.server("leaf1", g.cfg, nil, leafOpts(-time.Hour)...)
			g.leaf("leaf2")
			time.Sleep(g.cfg.Resources[0].LeaseLength)
			g.client("c1", []string{"leaf1"}, 10)
			g.client("c2", []string{"leaf1"}, 110)
			g.client("d1", []string{"leaf2"}, 120)
			g.run("steady, clocks hours apart", 30*time.Second)
			g.settled(10, 55, 55)
			g.net.Cut("c2", true)
			g.net.SetDown("leaf1", true)
			leaf1.abandon()
			g.run("leaf1 down, c2 cut off", 2*time.Second)
			back := time.Now().Add(-2 * time.Hour).UnixNano()
			again, _ := g.server("leaf1", g.cfg, nil, leafOpts(-2*time.Hour, withIncarnation(back))...)
			g.net.SetDown("leaf1", false)
			g.run("leaf1 restarted on a clock set back, c2 cut off", 30*time.Second)
			if old, now := leaf1.parent.base.inc.Load(), again.parent.base.inc.Load(); now <= old {
				g.t.Errorf("the restarted leaf's incarnation %d is not past its previous life's %d", now, old)
			}
			g.net.Cut("c2", false)
			g.run("c2 back", 40*time.Second)
			g.settled(10, 55, 55)
		})
	})
	// Three replicas set an hour apart hand mastership on while answers
	// to one client are lost: each new master learns for a lease length
	// on its own clock.
	t.Run("failover", func(t *testing.T) {
		scenario(t, issueConfig(), 100, func(g *rig) {
			e := &testElection{}
			addrs := []string{"s1", "s2", "s3"}
			e.elect("s1")
			_, kill1 := g.server("s1", g.cfg, e)
			g.server("s2", g.cfg, e, WithServerClock(skewed(-time.Hour)))
			g.server("s3", g.cfg, e, WithServerClock(skewed(time.Hour)))
			time.Sleep(10 * time.Second)
			for _, id := range []string{"a", "b", "c"} {
				g.client(id, addrs, 50)
			}
			g.run("three clients", 10*time.Second)
			g.net.set("a", fault{drop: true})
			g.net.SetDown("s1", true)
			kill1()
			e.elect("s2")
			g.run("s2 (an hour behind) learns", 15*time.Second)
			e.elect("s3")
			g.run("s3 (an hour ahead) learns", 15*time.Second)
			g.heal("a", 15*time.Second)
		})
	})
}

// replayer is a transport through which client id, once granted a lease
// with a token, claims it again and again: Has its wants, with that
// token, as a client that kept an old answer would.
type replayer struct {
	Transport
	id  string
	mu  sync.Mutex
	tok []byte
}

func (p *replayer) GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error) {
	p.mu.Lock()
	tok := p.tok
	p.mu.Unlock()
	if req.Client == p.id && tok != nil {
		req = clone(req)
		for i := range req.Resources {
			req.Resources[i].Has, req.Resources[i].Token = req.Resources[i].Wants, tok
		}
	}
	resp, err := p.Transport.GetCapacity(ctx, addr, req)
	if err == nil && req.Client == p.id && tok == nil && len(resp.Grants) > 0 && resp.Grants[0].Capacity > 0 {
		p.mu.Lock()
		p.tok = resp.Grants[0].Token
		p.mu.Unlock()
	}
	return resp, err
}

// TestFaultLeaseKeysSkewedClocks: lease keys check a token's expiry on
// the learning master's clock. x held all 100 and gave it back; h holds
// them, and has not reported to s2 when s2 takes over; x then replays its
// old token, expired for 15s. With s2's clock in step, the token is
// expired and x is credited nothing (Σ at most 100). With s2's clock 30s
// behind the clock of the replica that signed it, the token looks valid
// and x is credited 100: Σ 200, which is why the guide asks for the
// replicas' clocks to be within well under a lease of each other.
func TestFaultLeaseKeysSkewedClocks(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	for _, tc := range []struct {
		name  string
		skew  time.Duration
		bound float64
	}{{"in step", 0, 100}, {"s2 30s behind", -30 * time.Second, 200}} {
		t.Run(tc.name, func(t *testing.T) {
			scenario(t, issueConfig(), tc.bound, func(g *rig) {
				e := &testElection{}
				addrs := []string{"s1", "s2"}
				e.elect("s1")
				_, kill1 := g.server("s1", g.cfg, e, WithLeaseKeys(key))
				g.server("s2", g.cfg, e, WithLeaseKeys(key), WithServerClock(skewed(tc.skew)))
				time.Sleep(10 * time.Second)
				c, x := g.clientVia(&replayer{Transport: g.net, id: "x"}, "x", addrs, 100)
				g.run("x alone", 5*time.Second)
				if err := x.Close(); err != nil {
					g.t.Fatal(err)
				}
				g.client("h", addrs, 100)
				g.run("h holds all", 15*time.Second) // x's token expires
				g.net.set("h", fault{hang: true})    // h has not reported yet
				g.net.SetDown("s1", true)
				kill1()
				e.elect("s2")
				g.rate(c, 100) // x claims its old lease again
				g.run("s2 learns, x replays its token", 12*time.Second)
				g.net.set("h", fault{})
				g.run("h reports", 10*time.Second)
				if tc.skew != 0 && g.worst <= 100 {
					g.t.Errorf("with s2 behind, the replayed token took nothing (worst Σ %v): the test no longer shows the limit", g.worst)
				}
			})
		})
	}
}
