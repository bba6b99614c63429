package capacity

import (
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/internal/faultproxy"
)

// answerDelay is how late the answers are in the late-answers phase.
const answerDelay = 1500 * time.Millisecond

// TestWireFaults runs the setting over loopback HTTP/2 (gRPC),
// each client through its own fault proxy, on real time with leases of 2s:
// A holds all, B asks for all while A's answers are lost, then late, then
// while A's network hangs. Σ of what the clients enforce is sampled every 10ms.
func TestWireFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 13s of real time")
	}
	cfg := Config{Resources: []Template{{ID: "*", Capacity: 100, LeaseLength: 2 * time.Second, RefreshInterval: 400 * time.Millisecond}}}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLoopback(t, NewHandler(s))
	time.Sleep(2 * time.Second) // learning
	var res []*Resource
	open := func(id string) *faultproxy.Proxy {
		p := faultproxy.New(t, addr)
		hc := h2cClient()
		c, err := NewClient(NewHTTPTransport(hc, connect.WithGRPC()), []string{p.Addr}, WithClientID(id), WithMode(Pessimistic),
			WithMinRefreshGap(100*time.Millisecond), WithRetry(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			p.Set(faultproxy.Pass)
			c.Close()
			hc.CloseIdleConnections()
		})
		r, err := c.Rate("r", 100)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, r.Resource)
		return p
	}
	var worst float64
	run := func(step string, d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
			// Read in both orders and keep the lower sum: a lease
			// handed over between two reads in one order is seen in
			// neither state by the other.
			sum := func(rs []*Resource) (v float64) {
				for _, r := range rs {
					v += r.Capacity()
				}
				return v
			}
			fwd := sum(res)
			rev := slices.Clone(res)
			slices.Reverse(rev)
			got := min(fwd, sum(rev))
			worst = max(worst, got)
			if got > 100 {
				t.Fatalf("%s: clients enforce %v in all > 100", step, got)
			}
		}
	}
	a := open("a")
	run("a alone", time.Second)
	open("b")
	a.Set(faultproxy.DropAnswers)
	run("answers to a lost", 3*time.Second)
	a.Set(faultproxy.Pass)
	run("healed", time.Second)
	a.Set(faultproxy.LateAnswers(answerDelay))
	run("answers to a late", 3*time.Second)
	a.Set(faultproxy.Hang)
	run("a's network hangs", 3*time.Second)
	a.Set(faultproxy.Pass)
	run("healed again", 500*time.Millisecond)
	t.Logf("worst Σ enforced %v of 100", worst)
}
