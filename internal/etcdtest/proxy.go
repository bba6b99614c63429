package etcdtest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target, and
// can cut one client off from the server without the server noticing:
// while blocked, it holds what either side sends (connections stay open,
// nothing arrives), as a network partition or a frozen peer does.
// Its methods are safe for concurrent use.
type Proxy struct {
	// Addr is the proxy's host:port; Endpoint is http://Addr.
	Addr, Endpoint string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	blocked bool
	unblock chan struct{} // closed by Unblock
	conns   map[net.Conn]struct{}
	closed  bool
}

// NewProxy starts a proxy on a free 127.0.0.1 port to target (host:port
// or http://host:port), closed at the end of the test.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: proxy: %v", err)
	}
	if len(target) > 7 && target[:7] == "http://" {
		target = target[7:]
	}
	p := &Proxy{
		Addr: ln.Addr().String(), target: target, ln: ln,
		unblock: make(chan struct{}), conns: map[net.Conn]struct{}{},
	}
	p.Endpoint = "http://" + p.Addr
	close(p.unblock)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
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
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

// track registers a connection pair, or closes it when the proxy is
// closed.
func (p *Proxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		a.Close()
		b.Close()
		return false
	}
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
	return true
}

// pipe copies from src to dst, holding every chunk while blocked.
func (p *Proxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.unblock
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or closed: close both sides
			return
		}
	}
}

// Block holds all traffic through the proxy until Unblock.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blocked {
		p.blocked, p.unblock = true, make(chan struct{})
	}
}

// Unblock delivers the held traffic and lets traffic through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked {
		p.blocked = false
		close(p.unblock)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	if p.blocked {
		p.blocked = false
		close(p.unblock)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
