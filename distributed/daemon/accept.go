package daemon

import (
	"errors"
	"io"
	"net"
	"time"
)

// Accepting connections: the caps of MaxConns and MaxConnsPerAddr, and
// refusals.

// connLimits are the connection settings Reload may change.
type connLimits struct {
	maxConns, perAddr   int
	idle, write, budget time.Duration
}

func connLimitsOf(cfg Config) *connLimits {
	return &connLimits{maxConns: cfg.MaxConns, perAddr: cfg.MaxConnsPerAddr,
		idle: time.Duration(cfg.IdleTimeout), write: time.Duration(cfg.WriteTimeout), budget: time.Duration(cfg.IdleBudget)}
}

// peerKey names the client a connection comes from, for
// MaxConnsPerAddr: the IP address of a TCP peer, the process (user and
// process id, SO_PEERCRED) of a Unix-socket peer; "" when unknown.
func peerKey(c net.Conn) string {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case *net.UnixAddr:
		if cred := peerCred(c); cred != "" {
			return "unix:" + cred
		}
	}
	return ""
}

// refuse tells a connection over a limit so ("RF\n") and closes it. At
// most maxLingering refusals at a time wait for the reply to leave;
// beyond, connections are closed at once.
func (s *Server) refuse(c net.Conn) {
	if s.lingering.Add(1) > maxLingering {
		s.lingering.Add(-1)
		c.Close()
		return
	}
	go func() {
		defer s.lingering.Add(-1)
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		io.WriteString(c, replyRefused)
		lingerClose(c)
		c.Close()
	}()
}

// maxLingering bounds the refused connections closed gracefully at once.
const maxLingering = 64

func (s *Server) accept(ln net.Listener) {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off, keep going.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		cl := s.conf.Load()
		sc := &conn{c: c, peer: peerKey(c)}
		sc.last.Store(s.now())
		s.mu.Lock()
		var victim *conn
		ok := !s.closing
		if ok {
			victim, ok = s.admit(sc, cl)
		}
		switch {
		case ok:
			s.wg.Add(1)
			s.mu.Unlock()
			s.open(sc, victim)
			go s.serve(sc)
		case !s.closing && s.mayShare(sc):
			s.wg.Add(1)
			s.mu.Unlock()
			go s.share(sc, cl)
		default:
			closing := s.closing
			s.mu.Unlock()
			s.turnAway(sc, cl, closing)
		}
	}
}

// open counts sc, a connection admitted in the place of victim if not
// nil, and reclaims victim.
func (s *Server) open(sc, victim *conn) {
	if victim != nil {
		s.reclaim(victim)
	}
	s.st.conns.Add(1)
}

// turnAway refuses sc, a connection over a cap of cl (closes it at once
// if closing).
func (s *Server) turnAway(sc *conn, cl *connLimits, closing bool) {
	if s.st.rejected.Add(1)%1000 == 1 {
		s.log.Warn("connection limit reached, refusing new connections", "max_conns", cl.maxConns,
			"max_conns_per_addr", cl.perAddr, "client", sc.peer)
	}
	if closing {
		sc.c.Close()
	} else {
		s.refuse(sc.c)
	}
}

// share serves sc, a connection refused at its loopback address's cap,
// if it may take the place of another local process's (shareLoopback),
// and refuses it otherwise. The caller added it to s.wg.
func (s *Server) share(sc *conn, cl *connLimits) {
	victim, ok := s.shareLoopback(sc, cl)
	if !ok {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		s.turnAway(sc, cl, closing)
		s.wg.Done()
		return
	}
	s.open(sc, victim)
	s.serve(sc)
}

// replyBudget is the send buffer of a connection: the reply bytes it may
// owe (written, not yet taken by the client) before the server stops
// reading its queries. A connection that owes replies and takes none for
// WriteTimeout is reset, which frees its kernel memory at once (no
// FIN-WAIT orphan holding unsent replies).
const replyBudget = 16 << 10

// connMemory is what one connection may make the kernel hold, for sizing
// the default MaxConnsPerAddr: the server's send buffer (replyBudget,
// doubled by the kernel), and a default receive buffer at either end.
func connMemory() uint64 {
	return 2*replyBudget + 2*max(tcpRmemDefault(), 128<<10)
}

// oversized answers a line longer than MaxTagLen with ER and closes c.
func (s *Server) oversized(c net.Conn, out []byte) {
	s.st.bad.Add(1)
	s.log.Debug("oversized line, closing", "remote", c.RemoteAddr().String(), "max_tag_len", s.cfg.MaxTagLen)
	c.SetWriteDeadline(time.Now().Add(shutdownWrite))
	c.Write(append(out, replyError...))
	lingerClose(c)
}

// shutdownWrite bounds the flush of the last replies during Shutdown.
const shutdownWrite = 500 * time.Millisecond

func ceilMillis(d time.Duration) int64 {
	return int64((max(d, 0) + time.Millisecond - 1) / time.Millisecond)
}

// lingerClose half-closes c and discards what the client still sends,
// briefly, so that the error reply is not destroyed by a TCP reset.
func lingerClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		io.CopyN(io.Discard, c, 64<<10)
	}
}
