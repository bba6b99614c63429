package gossip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

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
	// Send sends one datagram of at most MaxPacket bytes (29 more as the
	// transport under Seal) to addr. It must not block for long and must
	// not keep p after returning.
	Send(addr string, p []byte) error
	// Listen starts delivering received datagrams to h, with the
	// address they came from ("" if unknown; the node then skips its
	// source check). h must not keep p after returning. Listen is called
	// once.
	Listen(h func(p []byte, from string)) error
	// Close stops delivery; after it returns h is not called again.
	Close() error
}

// errTransportClosed is returned by Send on a closed transport.
var errTransportClosed = fmt.Errorf("gossip: transport closed: %w", throttle.ErrClosed)

// recvBuffer is the socket receive buffer ListenUDP asks for (SO_RCVBUF;
// Linux caps it at net.core.rmem_max, which operators may raise).
const recvBuffer = 8 << 20

// udpTransport sends each datagram as one UDP packet. Create it with
// ListenUDP; it is safe for concurrent use.
type udpTransport struct {
	conn      *net.UDPConn
	mu        sync.Mutex
	addr      map[string]*net.UDPAddr // resolved peers
	done      chan struct{}
	listening bool // guarded by mu
	once      sync.Once
}

// ListenUDP binds a UDP socket on addr ("127.0.0.1:7946", ":0", ...) and
// returns a Transport that sends each datagram as one UDP packet, with an
// 8 MiB receive buffer (SO_RCVBUF; Linux caps it at net.core.rmem_max,
// which operators may raise). It is safe for concurrent use.
func ListenUDP(addr string) (Transport, error) {
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
	c.SetReadBuffer(recvBuffer)
	return &udpTransport{conn: c, addr: make(map[string]*net.UDPAddr), done: make(chan struct{})}, nil
}

// Addr returns the bound address, e.g. "127.0.0.1:40123".
func (u *udpTransport) Addr() string { return u.conn.LocalAddr().String() }

func (u *udpTransport) resolve(addr string) (*net.UDPAddr, error) {
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
func (u *udpTransport) matchAddr(peer, from string) bool {
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
func (u *udpTransport) Send(addr string, p []byte) error {
	ua, err := u.resolve(addr)
	if err != nil {
		return err
	}
	_, err = u.conn.WriteToUDP(p, ua)
	if errors.Is(err, net.ErrClosed) {
		return errTransportClosed
	}
	return err
}

// Listen starts a goroutine that reads packets and hands them to h.
func (u *udpTransport) Listen(h func(p []byte, from string)) error {
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
func (u *udpTransport) Close() error {
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
