package capacity

import (
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// proxyMode is what a faultProxy does to the bytes it carries.
type proxyMode int

const (
	pass        proxyMode = iota
	hang                  // forward nothing, close nothing: callers wait for their timeouts
	dropAnswers           // forward requests, swallow everything coming back
	lateAnswers           // forward everything, answers 1.5s late
)

// answerDelay is how late lateAnswers makes the answers.
const answerDelay = 1500 * time.Millisecond

// faultProxy is a TCP proxy on loopback between clients and a server,
// whose faults the test switches.
type faultProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	mode  proxyMode
	wake  chan struct{} // closed when mode changes
	conns []net.Conn
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, wake: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c, false) })
		p.wg.Go(func() { p.pipe(c, s, true) })
	}
}

// pipe copies src to dst through the faults; answers says src is the
// server.
func (p *faultProxy) pipe(dst, src net.Conn, answers bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for n > 0 {
			p.mu.Lock()
			mode, wake := p.mode, p.wake
			p.mu.Unlock()
			switch {
			case mode == hang:
				<-wake
				continue
			case mode == dropAnswers && answers:
			case mode == lateAnswers && answers:
				time.Sleep(answerDelay)
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			default:
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			n = 0
		}
		if err != nil {
			return
		}
	}
}

// set switches the faults. Leaving dropAnswers closes the connections,
// whose streams lost bytes.
func (p *faultProxy) set(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == dropAnswers && m != dropAnswers {
		p.closeConns()
	}
	p.mode = m
	close(p.wake)
	p.wake = make(chan struct{})
}

func (p *faultProxy) closeConns() {
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.set(pass)
	p.mu.Lock()
	p.closeConns()
	p.mu.Unlock()
	p.wg.Wait()
}

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
	open := func(id string) *faultProxy {
		p := newFaultProxy(t, addr)
		hc := h2cClient()
		c, err := NewClient(NewHTTPTransport(hc, connect.WithGRPC()), []string{p.addr()}, WithClientID(id), WithMode(Pessimistic),
			WithMinRefreshGap(100*time.Millisecond), WithRetry(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			p.set(pass)
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
	a.set(dropAnswers)
	run("answers to a lost", 3*time.Second)
	a.set(pass)
	run("healed", time.Second)
	a.set(lateAnswers)
	run("answers to a late", 3*time.Second)
	a.set(hang)
	run("a's network hangs", 3*time.Second)
	a.set(pass)
	run("healed again", 500*time.Millisecond)
	t.Logf("worst Σ enforced %v of 100", worst)
}
