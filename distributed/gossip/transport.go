package gossip

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
)

// Transport carries gossip datagrams between nodes, best effort: a
// datagram may be lost, duplicated, delayed or reordered, and the protocol
// tolerates all four.
//
// Implementations must be safe for concurrent use.
type Transport interface {
	// Addr returns this endpoint's address. Peers send to it, and it is
	// the node's ID in every message.
	Addr() string
	// Send sends one datagram of at most MaxPacket bytes to addr. It must
	// not block for long and must not keep p after returning.
	Send(addr string, p []byte) error
	// Listen starts delivering received datagrams to h, with the
	// address they came from ("" if unknown; the node then skips its
	// source check). h must not keep p after returning. Listen is called
	// once.
	Listen(h func(p []byte, from string)) error
	// Close stops delivery; after it returns h is not called again.
	Close() error
}

// ErrTransportClosed is returned by Send on a closed transport.
var ErrTransportClosed = fmt.Errorf("gossip: transport closed: %w", throttle.ErrClosed)

// RecvBuffer is the socket receive buffer ListenUDP asks for (SO_RCVBUF;
// Linux caps it at net.core.rmem_max, which operators may raise).
const RecvBuffer = 8 << 20

// UDPTransport sends each datagram as one UDP packet. Create it with
// ListenUDP (the zero value is not usable); it is safe for concurrent use.
type UDPTransport struct {
	conn      *net.UDPConn
	mu        sync.Mutex
	addr      map[string]*net.UDPAddr // resolved peers
	done      chan struct{}
	listening bool // guarded by mu
	once      sync.Once
}

// ListenUDP binds a UDP socket on addr ("127.0.0.1:7946", ":0", ...).
func ListenUDP(addr string) (*UDPTransport, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip address %q: %v", throttle.ErrInvalid, addr, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	// A round may bring many datagrams at once: a large receive buffer
	// keeps them (the kernel caps it at net.core.rmem_max).
	c.SetReadBuffer(RecvBuffer)
	return &UDPTransport{conn: c, addr: make(map[string]*net.UDPAddr), done: make(chan struct{})}, nil
}

// Addr returns the bound address, e.g. "127.0.0.1:40123".
func (u *UDPTransport) Addr() string { return u.conn.LocalAddr().String() }

func (u *UDPTransport) resolve(addr string) (*net.UDPAddr, error) {
	u.mu.Lock()
	ua, ok := u.addr[addr]
	u.mu.Unlock()
	if ok {
		return ua, nil
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: peer address %q: %v", throttle.ErrInvalid, addr, err)
	}
	u.mu.Lock()
	if len(u.addr) > 4096 {
		clear(u.addr)
	}
	u.addr[addr] = ua
	u.mu.Unlock()
	return ua, nil
}

// matchAddr reports whether a datagram from from may come from the peer
// known as peer: the same IP address and port once peer is resolved.
func (u *UDPTransport) matchAddr(peer, from string) bool {
	if peer == from {
		return true
	}
	ua, err := u.resolve(peer)
	if err != nil {
		return false
	}
	fa, err := net.ResolveUDPAddr("udp", from)
	return err == nil && ua.Port == fa.Port && ua.IP.Equal(fa.IP)
}

// Send writes p to addr in one UDP packet.
func (u *UDPTransport) Send(addr string, p []byte) error {
	ua, err := u.resolve(addr)
	if err != nil {
		return err
	}
	_, err = u.conn.WriteToUDP(p, ua)
	if errors.Is(err, net.ErrClosed) {
		return ErrTransportClosed
	}
	return err
}

// Listen starts a goroutine that reads packets and hands them to h.
func (u *UDPTransport) Listen(h func(p []byte, from string)) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.listening {
		return fmt.Errorf("%w: Listen called twice", throttle.ErrInvalid)
	}
	u.listening = true
	go func() {
		defer close(u.done)
		buf := make([]byte, 64<<10)
		for {
			n, from, err := u.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			h(buf[:n], netip.AddrPortFrom(from.Addr().Unmap(), from.Port()).String())
		}
	}()
	return nil
}

// Close closes the socket and waits for the reading goroutine, if any.
func (u *UDPTransport) Close() error {
	var err error
	u.once.Do(func() {
		err = u.conn.Close()
		u.mu.Lock()
		listening := u.listening
		u.mu.Unlock()
		if listening {
			<-u.done
		}
	})
	return err
}

// Network is an in-memory datagram network on virtual time, for tests and
// simulations. Datagrams are queued with a delay and handed to receivers
// only by Deliver, on the caller's goroutine, so a simulation decides
// exactly when messages arrive. Loss, duplication, delay, jitter (which
// reorders) and partitions are configurable at any time. It is safe for
// concurrent use; create it with NewNetwork (the zero value is not usable).
type Network struct {
	clk throttle.Clock

	mu        sync.Mutex
	rng       *rand.Rand
	loss, dup float64
	qlimit    int            // datagrams in flight to one address beyond which more are dropped; 0: no limit
	inFlight  map[string]int // per destination
	delay     time.Duration
	jitter    time.Duration
	group     map[string]int // partition group per address; absent = 0
	eps       map[string]*memEndpoint
	queue     flightQueue
	seq       uint64
	stats     NetworkStats
}

// NetworkStats counts what a Network did with datagrams.
type NetworkStats struct {
	Sent, Delivered, Lost, Duplicated, Partitioned, Unroutable uint64
	Overrun                                                    uint64 // dropped: the receiver's queue was full
	Bytes                                                      uint64
}

// NewNetwork returns an empty network on clk with a seeded random source.
func NewNetwork(clk throttle.Clock, seed uint64) *Network {
	return &Network{clk: clk, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		group: map[string]int{}, eps: map[string]*memEndpoint{}, inFlight: map[string]int{}}
}

// SetLoss sets the probability that a datagram is dropped.
func (n *Network) SetLoss(p float64) { n.mu.Lock(); n.loss = p; n.mu.Unlock() }

// SetQueueLimit models a receive buffer: a datagram sent to an address
// that already has n in flight is dropped (NetworkStats.Overrun). 0
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
func (n *Network) Stats() NetworkStats { n.mu.Lock(); defer n.mu.Unlock(); return n.stats }

// Endpoint returns a transport on the network with address addr.
func (n *Network) Endpoint(addr string) Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	e := &memEndpoint{net: n, addr: addr}
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
	if len(p) > MaxPacket+SealOverhead {
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

type memEndpoint struct {
	net    *Network
	addr   string
	h      func([]byte, string) // guarded by net.mu
	closed bool                 // guarded by net.mu
}

func (e *memEndpoint) Addr() string { return e.addr }

func (e *memEndpoint) Send(addr string, p []byte) error {
	e.net.mu.Lock()
	closed := e.closed
	e.net.mu.Unlock()
	if closed {
		return ErrTransportClosed
	}
	return e.net.send(e.addr, addr, p)
}

func (e *memEndpoint) Listen(h func([]byte, string)) error {
	e.net.mu.Lock()
	defer e.net.mu.Unlock()
	e.h = h
	return nil
}

func (e *memEndpoint) Close() error {
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
