package capacity

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestFaultReorderedCalls: a call of client a held up in the network
// past a's timeout reaches the server after a's newer calls. Applied, it
// would roll the server's view of a back: an old demand, or a release of
// a lease a has taken again since (then b is granted what a still
// holds). The server must ignore it.
func TestFaultReorderedCalls(t *testing.T) {
	t.Run("demand", func(t *testing.T) {
		scenario(t, issueConfig(), 100, func(g *rig) {
			s := g.warm()
			a := g.client("a", []string{"s1"}, 80)
			g.run("a alone", 5*time.Second)
			g.net.set("a", fault{slowIn: 8 * time.Second})
			if err := a.SetWants(20); err != nil { // the call asking 20 is held up
				g.t.Fatal(err)
			}
			// The call goes out within the minimum refresh gap (1s), and
			// a's retry of it, asking 20 too, 5s later.
			g.run("a's call held up", 1500*time.Millisecond)
			g.net.set("a", fault{})
			g.run("a retries", 5*time.Second)
			if err := a.SetWants(60); err != nil {
				g.t.Fatal(err)
			}
			for range 150 {
				if st := s.Status(); st.Resources[0].Wants == 60 {
					break
				}
				g.run("a asks 60", 10*time.Millisecond)
			}
			// The held-up call (wants 20) arrives 8s after it was sent:
			// the server must keep a's newer demand, 60, throughout.
			for range 400 {
				g.run("the held-up call arrives", 10*time.Millisecond)
				if st := s.Status(); len(st.Resources) != 1 || st.Resources[0].Wants != 60 {
					g.t.Fatalf("t=%v: the server's view of a regressed: %+v", time.Since(g.start), st.Resources)
				}
			}
		})
	})
	t.Run("release", func(t *testing.T) {
		scenario(t, issueConfig(), 100, func(g *rig) {
			g.warm()
			c, r1 := g.clientVia(g.net, "a", []string{"s1"}, 100)
			g.run("a alone", 5*time.Second)
			// a gives r back; the release is held up, a's retry of it
			// goes through after a's timeout (5s).
			g.net.set("a", fault{slowIn: 8 * time.Second})
			closed := make(chan error, 1)
			go func() { closed <- r1.Close() }()
			g.run("a's release held up", 100*time.Millisecond)
			g.net.set("a", fault{})
			g.run("a closes r", 5*time.Second)
			if err := <-closed; err != nil {
				g.t.Fatal(err)
			}
			// a opens r again and takes all of it, before the held-up
			// release arrives (8s after it was sent).
			r2 := g.rate(c, 100)
			g.run("a holds r again", 3*time.Second)
			g.client("b", []string{"s1"}, 100)
			g.run("b asks for r", 30*time.Second)
			if l, ok := r2.Lease(); !ok || l.Capacity == 0 {
				g.t.Errorf("a's lease on r: %+v, %v", l, ok)
			}
		})
	})
}

// TestStaleCallsChangeNothing: the server applies a client's calls only
// in order of (incarnation, sequence), answering an older one Stale; a
// new incarnation of the client goes first, and unsequenced calls are
// always applied.
func TestStaleCallsChangeNothing(t *testing.T) {
	s, _ := pastLearning(t, 100)
	get := func(inc int64, seq uint64, wants float64) *Response {
		t.Helper()
		resp, err := s.GetCapacity(context.Background(), &Request{Client: "a", Incarnation: inc, Sequence: seq, Resources: []ResourceRequest{{Resource: "r", Wants: wants}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	wants := func() float64 { return s.Status().Resources[0].Wants }
	if r := get(10, 5, 50); r.Stale || r.Grants[0].Capacity != 50 {
		t.Fatalf("first call: %+v", r)
	}
	for _, c := range []struct {
		inc int64
		seq uint64
	}{{10, 4}, {10, 5}, {9, 100}} {
		if r := get(c.inc, c.seq, 20); !r.Stale || r.Incarnation != 10 || len(r.Grants) != 0 || wants() != 50 {
			t.Errorf("call (%d, %d) after (10, 5): %+v, wants %v; want it ignored as stale", c.inc, c.seq, r, wants())
		}
	}
	if _, err := s.Release(context.Background(), &ReleaseRequest{Client: "a", Resources: []string{"r"}, Incarnation: 10, Sequence: 3}); err != nil || wants() != 50 {
		t.Errorf("an older release took effect: %v, wants %v", err, wants())
	}
	if r := get(11, 1, 30); r.Stale || wants() != 30 { // a restarted client
		t.Errorf("new incarnation: %+v, wants %v", r, wants())
	}
	if r := get(0, 0, 40); r.Stale || wants() != 40 { // a client that does not number its calls
		t.Errorf("unsequenced call: %+v, wants %v", r, wants())
	}
}

// TestClientMovesPastAnOlderLife: a client restarted on a clock set back
// (its incarnation below its previous life's) is answered Stale once,
// takes up a newer incarnation, and gets its lease.
func TestClientMovesPastAnOlderLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, n := warmServer(t, 100)
		future := time.Now().Add(time.Hour).UnixNano()
		if _, err := s.GetCapacity(context.Background(), &Request{Client: "a", Incarnation: future, Sequence: 7, Resources: []ResourceRequest{{Resource: "r", Wants: 10}}}); err != nil {
			t.Fatal(err)
		}
		c := newClient(t, n, "a")
		r := openResource(t, c, "r", 30)
		time.Sleep(time.Second)
		if l, ok := r.Lease(); !ok || l.Capacity != 30 {
			t.Fatalf("lease %+v, %v; client err %v", l, ok, c.Err())
		}
		if c.inc.Load() <= future {
			t.Fatalf("incarnation %d not past %d", c.inc.Load(), future)
		}
	})
}

// TestFaultReleaseRetriedAfterRetake: A gives r back while its calls hang,
// the network heals, and A opens r again and gets its lease back while
// the release is still being retried. The retried release must not free
// the lease A has since taken again (it keeps using it) for B.
func TestFaultReleaseRetriedAfterRetake(t *testing.T) {
	scenario(t, issueConfig(), 100, func(g *rig) {
		g.warm()
		c, a := g.clientVia(g.net, "a", []string{"s1"}, 100)
		g.run("a alone", 5*time.Second)
		g.net.set("a", fault{hang: true})
		go a.Close() // its first try hangs until the client's timeout
		g.run("a gives r back, cut off", time.Second)
		g.net.set("a", fault{})
		g.rate(c, 100)
		g.run("a takes r again", time.Second)
		g.client("b", []string{"s1"}, 100)
		g.run("the release is retried", 20*time.Second)
	})
}
