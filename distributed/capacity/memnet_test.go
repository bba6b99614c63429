package capacity

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/retry"
)

// memNetwork is an in-memory Transport connecting clients to servers in the
// same process, with faults to inject: servers that are down, clients cut
// off, and a latency (slept on the caller's clock, so virtual inside a
// testing/synctest bubble). The zero value is an empty network. It is safe
// for concurrent use.
type memNetwork struct {
	mu      sync.Mutex
	servers map[string]*Server
	down    map[string]bool
	cut     map[string]bool
	latency time.Duration
}

var _ Transport = (*memNetwork)(nil)

// Attach serves s at addr, replacing whatever was there.
func (n *memNetwork) Attach(addr string, s *Server) {
	put(n, &n.servers, addr, s)
}

// SetDown makes the server at addr unreachable (down true) or reachable.
func (n *memNetwork) SetDown(addr string, down bool) {
	put(n, &n.down, addr, down)
}

// Cut makes every call of client fail (cut true), as if it had lost the
// network, or heals it.
func (n *memNetwork) Cut(client string, cut bool) {
	put(n, &n.cut, client, cut)
}

// put sets (*m)[k] to v under n's lock, making the map on first use.
func put[V any](n *memNetwork, m *map[string]V, k string, v V) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if *m == nil {
		*m = map[string]V{}
	}
	(*m)[k] = v
}

// SetLatency delays every call by d on the way to the server and by d
// on the way back.
func (n *memNetwork) SetLatency(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.latency = d
}

func (n *memNetwork) route(ctx context.Context, addr, client string) (*Server, error) {
	n.mu.Lock()
	s, down, cut := n.servers[addr], n.down[addr], n.cut[client]
	n.mu.Unlock()
	if err := n.delay(ctx); err != nil {
		return nil, err
	}
	if s == nil || down || cut {
		return nil, fmt.Errorf("%w: capacity: no server reachable at %q", throttle.ErrUnavailable, addr)
	}
	return s, nil
}

// delay sleeps for the latency, one way.
func (n *memNetwork) delay(ctx context.Context) error {
	n.mu.Lock()
	lat := n.latency
	n.mu.Unlock()
	if lat <= 0 {
		return nil
	}
	if err := retry.Sleep(ctx, lat); err != nil {
		return fmt.Errorf("%w: capacity: %v", throttle.ErrUnavailable, err)
	}
	return nil
}

// GetCapacity calls GetCapacity of the server at addr, with the latency
// on the way there and back.
func (n *memNetwork) GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error) {
	if req == nil {
		return nil, invalidf("nil request")
	}
	return n.call(ctx, addr, req.Client, func(s *Server) (*Response, error) { return s.GetCapacity(ctx, req) })
}

// Release calls Release of the server at addr, with the latency on the
// way there and back.
func (n *memNetwork) Release(ctx context.Context, addr string, req *ReleaseRequest) (*Response, error) {
	if req == nil {
		return nil, invalidf("nil request")
	}
	return n.call(ctx, addr, req.Client, func(s *Server) (*Response, error) { return s.Release(ctx, req) })
}

// call routes a call of client to the server at addr, lets serve answer
// it there and delays the answer on its way back.
func (n *memNetwork) call(ctx context.Context, addr, client string, serve func(*Server) (*Response, error)) (*Response, error) {
	s, err := n.route(ctx, addr, client)
	if err != nil {
		return nil, err
	}
	resp, err := serve(s)
	if derr := n.delay(ctx); derr != nil && err == nil {
		return nil, derr
	}
	return resp, err
}
