// Package simnet carries gossip datagrams (a gossip.Transport) over a
// fault simulation's message fabric, faultsim.Net: each process of the
// simulation has an address, and a datagram sent to it is delivered, if
// the fabric lets it through, to whichever life of that process listens
// when it arrives (a crashed process's next life gets what is sent after
// it restarted).
package simnet

import (
	"bytes"
	"errors"
	"sync"

	"github.com/throttlekit/throttle/internal/faultsim"
)

// ErrClosed is returned by Send on a closed endpoint.
var ErrClosed = errors.New("simnet: endpoint closed")

// Fabric routes the datagrams of processes 0..len(addrs)-1, known by
// addrs, over a faultsim.Net. It is safe for concurrent use.
type Fabric struct {
	net   *faultsim.Net
	addrs []string
	mu    sync.Mutex
	cur   []*Endpoint // the current life's endpoint of each process
}

// New returns a fabric of the processes known by addrs over net.
func New(net *faultsim.Net, addrs []string) *Fabric {
	return &Fabric{net: net, addrs: addrs, cur: make([]*Endpoint, len(addrs))}
}

// Endpoint returns a new endpoint for process i, which receives from now
// on what arrives for i (the endpoint of i's previous life, if any, no
// longer does).
func (f *Fabric) Endpoint(i int) *Endpoint {
	e := &Endpoint{f: f, i: i}
	f.mu.Lock()
	f.cur[i] = e
	f.mu.Unlock()
	return e
}

func (f *Fabric) index(addr string) int {
	for i, a := range f.addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// deliver hands p, from process from, to process to's current endpoint.
func (f *Fabric) deliver(to int, p []byte, from string) {
	f.mu.Lock()
	e := f.cur[to]
	f.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	h, closed := e.h, e.closed
	e.mu.Unlock()
	if h != nil && !closed {
		h(p, from)
	}
}

// Endpoint is one life's datagram endpoint; it implements
// gossip.Transport. It is safe for concurrent use.
type Endpoint struct {
	f      *Fabric
	i      int
	mu     sync.Mutex
	h      func([]byte, string)
	closed bool
}

// Addr returns the process's address.
func (e *Endpoint) Addr() string { return e.f.addrs[e.i] }

// Send sends p to the process known by addr as one message of the
// fabric; an unknown address drops it.
func (e *Endpoint) Send(addr string, p []byte) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return ErrClosed
	}
	to := e.f.index(addr)
	if to < 0 {
		return nil
	}
	q, from := bytes.Clone(p), e.Addr()
	e.f.net.Send(e.i, to, func() { e.f.deliver(to, q, from) })
	return nil
}

// Listen sets the handler of the datagrams that arrive.
func (e *Endpoint) Listen(h func(p []byte, from string)) error {
	e.mu.Lock()
	e.h = h
	e.mu.Unlock()
	return nil
}

// Close stops delivery to the endpoint and sending from it.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	return nil
}
