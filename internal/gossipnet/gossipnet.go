// Package gossipnet is an in-memory datagram network on virtual time for
// the tests and simulations of the gossip nodes: its endpoints are
// gossip Transports (Addr, Send, Listen, Close).
package gossipnet

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
)

// errClosed is returned by Send on a closed endpoint.
var errClosed = fmt.Errorf("gossipnet: endpoint closed: %w", throttle.ErrClosed)

// Network is an in-memory datagram network on virtual time, for tests and
// simulations. Datagrams are queued with a delay and handed to receivers
// only by Deliver, on the caller's goroutine, so a simulation decides
// exactly when messages arrive. Loss, duplication, delay, jitter (which
// reorders) and partitions are configurable at any time. It is safe for
// concurrent use; create it with New (the zero value is not usable).
type Network struct {
	clk throttle.Clock
	max int // longest datagram carried, 0: any

	mu        sync.Mutex
	rng       *rand.Rand
	loss, dup float64
	qlimit    int            // datagrams in flight to one address beyond which more are dropped; 0: no limit
	inFlight  map[string]int // per destination
	delay     time.Duration
	jitter    time.Duration
	group     map[string]int // partition group per address; absent = 0
	eps       map[string]*Endpoint
	queue     flightQueue
	seq       uint64
	stats     Stats
}

// Stats counts what a Network did with datagrams.
type Stats struct {
	Sent, Delivered, Lost, Duplicated, Partitioned, Unroutable uint64
	Overrun                                                    uint64 // dropped: the receiver's queue was full
	Bytes                                                      uint64
}

// New returns an empty network on clk with a seeded random source, that
// drops datagrams over maxDatagram bytes (0: none).
func New(clk throttle.Clock, seed uint64, maxDatagram int) *Network {
	return &Network{clk: clk, max: maxDatagram, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		group: map[string]int{}, eps: map[string]*Endpoint{}, inFlight: map[string]int{}}
}

// SetLoss sets the probability that a datagram is dropped.
func (n *Network) SetLoss(p float64) { n.mu.Lock(); n.loss = p; n.mu.Unlock() }

// SetQueueLimit models a receive buffer: a datagram sent to an address
// that already has n in flight is dropped (Stats.Overrun). 0
// removes the limit.
func (n *Network) SetQueueLimit(k int) { n.mu.Lock(); n.qlimit = k; n.mu.Unlock() }

// SetDuplicate sets the probability that a datagram is delivered twice.
func (n *Network) SetDuplicate(p float64) { n.mu.Lock(); n.dup = p; n.mu.Unlock() }

// SetDelay sets the delivery delay: delay plus a uniform random jitter in
// [0, jitter), which reorders datagrams.
func (n *Network) SetDelay(delay, jitter time.Duration) {
	n.mu.Lock()
	n.delay, n.jitter = delay, jitter
	n.mu.Unlock()
}

// Partition splits the network: addresses in different groups cannot
// reach each other (datagrams in flight across the cut are dropped at
// delivery). Addresses not listed form one more group.
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.group)
	for i, g := range groups {
		for _, a := range g {
			n.group[a] = i + 1
		}
	}
}

// Heal removes every partition.
func (n *Network) Heal() { n.Partition() }

// Stats returns the counters so far.
func (n *Network) Stats() Stats { n.mu.Lock(); defer n.mu.Unlock(); return n.stats }

// Endpoint returns a transport on the network with address addr.
func (n *Network) Endpoint(addr string) *Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := &Endpoint{net: n, addr: addr}
	n.eps[addr] = e
	return e
}

// Pending returns the number of datagrams in flight.
func (n *Network) Pending() int { n.mu.Lock(); defer n.mu.Unlock(); return n.queue.Len() }

// NextDue returns when the earliest datagram in flight is due, and false
// if none is in flight.
func (n *Network) NextDue() (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queue.Len() == 0 {
		return time.Time{}, false
	}
	return n.queue[0].due, true
}

// Deliver hands every datagram due by the clock's current time to its
// receiver, in due order, and returns how many it delivered. Handlers run
// on the caller's goroutine.
func (n *Network) Deliver() int {
	now := n.clk.Now()
	count := 0
	for {
		n.mu.Lock()
		if n.queue.Len() == 0 || n.queue[0].due.After(now) {
			n.mu.Unlock()
			return count
		}
		f := heap.Pop(&n.queue).(*flight)
		n.inFlight[f.to]--
		e := n.eps[f.to]
		cut := n.group[f.from] != n.group[f.to]
		var h func([]byte, string)
		switch {
		case cut:
			n.stats.Partitioned++
		case e == nil || e.closed || e.h == nil:
			n.stats.Unroutable++
		default:
			h = e.h
			n.stats.Delivered++
		}
		n.mu.Unlock()
		if h != nil {
			h(f.p, f.from)
			count++
		}
	}
}

func (n *Network) send(from, to string, p []byte) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stats.Sent++
	n.stats.Bytes += uint64(len(p))
	if n.max > 0 && len(p) > n.max {
		n.stats.Lost++
		return nil
	}
	if n.group[from] != n.group[to] {
		n.stats.Partitioned++
		return nil
	}
	copies := 1
	if n.loss > 0 && n.rng.Float64() < n.loss {
		copies = 0
		n.stats.Lost++
	} else if n.dup > 0 && n.rng.Float64() < n.dup {
		copies = 2
		n.stats.Duplicated++
	}
	if n.qlimit > 0 && n.inFlight[to]+copies > n.qlimit {
		n.stats.Overrun++
		return nil
	}
	now := n.clk.Now()
	n.inFlight[to] += copies
	for range copies {
		d := n.delay
		if n.jitter > 0 {
			d += time.Duration(n.rng.Int64N(int64(n.jitter)))
		}
		n.seq++
		heap.Push(&n.queue, &flight{due: now.Add(d), seq: n.seq, from: from, to: to, p: append([]byte(nil), p...)})
	}
	return nil
}

// Endpoint is one address of a Network: a gossip Transport. It is safe
// for concurrent use.
type Endpoint struct {
	net    *Network
	addr   string
	h      func([]byte, string) // guarded by net.mu
	closed bool                 // guarded by net.mu
}

// Addr returns the endpoint's address.
func (e *Endpoint) Addr() string { return e.addr }

// Send queues p to addr, unless the network loses or partitions it.
func (e *Endpoint) Send(addr string, p []byte) error {
	e.net.mu.Lock()
	closed := e.closed
	e.net.mu.Unlock()
	if closed {
		return errClosed
	}
	return e.net.send(e.addr, addr, p)
}

// Listen sets the handler Deliver calls with the datagrams to e.
func (e *Endpoint) Listen(h func([]byte, string)) error {
	e.net.mu.Lock()
	defer e.net.mu.Unlock()
	e.h = h
	return nil
}

// Close takes e off the network: its Send fails, and nothing more is
// delivered to it.
func (e *Endpoint) Close() error {
	e.net.mu.Lock()
	defer e.net.mu.Unlock()
	e.closed = true
	if e.net.eps[e.addr] == e {
		delete(e.net.eps, e.addr)
	}
	return nil
}

type flight struct {
	due      time.Time
	seq      uint64
	from, to string
	p        []byte
}

type flightQueue []*flight

func (q flightQueue) Len() int { return len(q) }
func (q flightQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].seq < q[j].seq
}
func (q flightQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *flightQueue) Push(x any)   { *q = append(*q, x.(*flight)) }
func (q *flightQueue) Pop() any {
	old := *q
	f := old[len(old)-1]
	*q = old[:len(old)-1]
	return f
}
