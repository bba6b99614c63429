// Package faultproxy is a TCP proxy on loopback for tests: it stands
// between clients and a server, and the test switches its fault at any
// time. Hang holds what either side sends (connections stay open, nothing
// arrives), as a network partition or a frozen peer does; DropAnswers
// forwards requests and swallows what comes back; LateAnswers delivers
// the answers late. Requests are what the side that connected sends,
// answers what the target sends.
package faultproxy

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fault is what a Proxy does to the bytes it carries. The zero Fault is
// Pass.
type Fault struct {
	kind  kind
	delay time.Duration
}

type kind int

const (
	pass kind = iota
	hang
	drop
	late
)

var (
	// Pass forwards everything.
	Pass = Fault{}
	// Hang forwards nothing and closes nothing: callers wait for their
	// timeouts. What was held is delivered when the fault changes.
	Hang = Fault{kind: hang}
	// DropAnswers forwards requests and swallows every answer. Leaving it
	// closes the connections, whose streams lost bytes.
	DropAnswers = Fault{kind: drop}
)

// LateAnswers forwards everything, the answers d late.
func LateAnswers(d time.Duration) Fault { return Fault{kind: late, delay: d} }

// Proxy forwards TCP connections from a loopback port to a target. Its
// methods are safe for concurrent use.
type Proxy struct {
	// Addr is the proxy's host:port; Endpoint is http://Addr.
	Addr, Endpoint string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	fault  Fault
	wake   chan struct{} // closed when the fault changes
	conns  []net.Conn
	closed bool
}

// New starts a proxy on a free 127.0.0.1 port to target (host:port or
// http://host:port), passing everything, closed at the end of the test.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	p := &Proxy{
		Addr: ln.Addr().String(), target: strings.TrimPrefix(target, "http://"),
		ln: ln, wake: make(chan struct{}),
	}
	p.Endpoint = "http://" + p.Addr
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
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
		if !p.track(c, s) {
			return
		}
		p.wg.Go(func() { p.pipe(s, c, false) })
		p.wg.Go(func() { p.pipe(c, s, true) })
	}
}

// track registers a connection pair, or closes it when the proxy is
// closed.
func (p *Proxy) track(c, s net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		s.Close()
		return false
	}
	p.conns = append(p.conns, c, s)
	return true
}

// pipe copies src to dst through the fault; answers says src is the
// target. It closes dst when src ends.
func (p *Proxy) pipe(dst, src net.Conn, answers bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.forward(dst, buf[:n], answers) {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward writes b to dst as the fault says, waiting while it hangs, and
// reports whether dst is still writable.
func (p *Proxy) forward(dst net.Conn, b []byte, answers bool) bool {
	for {
		p.mu.Lock()
		f, wake := p.fault, p.wake
		p.mu.Unlock()
		switch {
		case f.kind == hang:
			<-wake
			continue
		case f.kind == drop && answers:
			return true
		case f.kind == late && answers:
			time.Sleep(f.delay)
		}
		_, err := dst.Write(b)
		return err == nil
	}
}

// Set switches the fault.
func (p *Proxy) Set(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault.kind == drop && f.kind != drop {
		p.closeConns()
	}
	p.fault = f
	close(p.wake)
	p.wake = make(chan struct{})
}

func (p *Proxy) closeConns() {
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Close stops the proxy and closes every connection through it. It is
// idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	p.mu.Unlock()
	p.Set(Pass)
	p.mu.Lock()
	p.closeConns()
	p.mu.Unlock()
	p.wg.Wait()
}
