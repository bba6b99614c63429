// Package daemon is the server side of the throttled line protocol, as a
// library: one instance per host answers "serve or throttle this tag?"
// for many local workers, deciding locally with a gossip-adjusted token
// bucket (package gossip) that peers on other hosts keep in step.
//
// # Protocol
//
// A client connects over TCP or a Unix socket and sends a tag followed by
// "\n" (a trailing "\r" is ignored). The reply is exactly three bytes:
// "OK\n" (serve), "NO\n" (throttle), or "ER\n" for a malformed query: an
// empty tag keeps the connection open, a line longer than MaxTagLen closes
// it. Connections are reused for any number of queries, and queries may
// be pipelined: replies come back in order, flushed when the server has
// read every query it had. A bad line affects only its own connection.
//
// Each tag is charged one token of the limit of the first rule whose
// pattern it matches (or the default limit). With gossip peers, every
// daemon is charged for the hits of all daemons, one gossip interval
// late; see package gossip for the guarantees.
package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
)

// Replies of the protocol.
const (
	ReplyOK    = "OK\n"
	ReplyNO    = "NO\n"
	ReplyError = "ER\n"
)

// Server answers queries on its listeners. Create it with New, run it with
// Start, stop it with Shutdown. All methods are safe for concurrent use.
// The zero value is not usable.
type Server struct {
	cfg   Config
	log   *slog.Logger
	node  *gossip.Node
	exact map[string]*gossip.Limiter // rules without wildcards
	globs []globRule
	def   *gossip.Limiter

	lns []net.Listener

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
	started bool
	stopped atomic.Bool // closing, readable without mu
	wg      sync.WaitGroup

	st struct {
		conns, rejected, queries, ok, no, bad atomic.Uint64
	}
}

type globRule struct {
	pattern string
	lim     *gossip.Limiter
}

// Stats counts what a Server did.
type Stats struct {
	Conns      int    // connections open now
	Accepted   uint64 // connections accepted in all
	Rejected   uint64 // connections closed at once: MaxConns reached
	Queries    uint64 // well-formed queries answered
	Allowed    uint64 // of which "OK"
	Throttled  uint64 // of which "NO"
	BadQueries uint64 // lines answered "ER"
	Gossip     gossip.Stats
}

// New validates cfg, creates the gossip node and its limiters, and binds
// every listener (so Addrs is known before Start). opts (throttle.WithClock,
// WithMaxKeys, ...) apply to the limiters. log may be nil (discard).
func New(cfg Config, log *slog.Logger, opts ...throttle.Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, exact: map[string]*gossip.Limiter{}, conns: map[net.Conn]struct{}{}}
	gc := gossip.Config{ID: cfg.Gossip.Advertise, Peers: cfg.Gossip.Peers, Interval: time.Duration(cfg.Gossip.Interval), SpendCap: cfg.Gossip.SpendCap, Copies: cfg.Gossip.Copies}
	if cfg.Gossip.Listen != "" {
		secret, err := cfg.Gossip.secret()
		if err != nil {
			return nil, err
		}
		if len(secret) < gossip.MinSecretLen {
			return nil, fmt.Errorf("%w: gossip needs a secret of %d bytes or more (gossip.secret, gossip.secret_file or THROTTLED_SECRET)",
				throttle.ErrInvalid, gossip.MinSecretLen)
		}
		tr, err := gossip.ListenUDP(cfg.Gossip.Listen)
		if err != nil {
			return nil, fmt.Errorf("gossip listen: %w", err)
		}
		gc.Transport, gc.Secret = tr, secret
	}
	opts = append([]throttle.Option{throttle.WithMaxKeyLen(cfg.MaxTagLen)}, opts...)
	node, err := gossip.NewNode(gc, opts...)
	if err != nil {
		if gc.Transport != nil {
			gc.Transport.Close()
		}
		return nil, err
	}
	s.node = node
	fail := func(err error) (*Server, error) {
		for _, l := range s.lns {
			l.Close()
		}
		node.Close()
		return nil, err
	}
	newLim := func(name string, l Limit) (*gossip.Limiter, error) {
		r, err := throttle.ParseRate(l.Rate)
		if err != nil {
			return nil, err
		}
		return node.NewLimiter(name, r, l.Burst)
	}
	if s.def, err = newLim("default", cfg.Default); err != nil {
		return fail(err)
	}
	for _, r := range cfg.Rules {
		lim, err := newLim("rule:"+r.Pattern, r.Limit)
		if err != nil {
			return fail(fmt.Errorf("rule %q: %w", r.Pattern, err))
		}
		if isLiteral(r.Pattern) {
			if _, dup := s.exact[r.Pattern]; !dup {
				s.exact[r.Pattern] = lim
			}
		} else {
			s.globs = append(s.globs, globRule{r.Pattern, lim})
		}
	}
	for _, l := range cfg.Listen {
		network, addr, _ := splitListen(l)
		if network == "unix" {
			removeStaleSocket(addr)
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			return fail(err)
		}
		s.lns = append(s.lns, ln)
	}
	return s, nil
}

func isLiteral(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] == '*' || p[i] == '?' {
			return false
		}
	}
	return true
}

// removeStaleSocket removes a Unix socket file that no process listens on.
func removeStaleSocket(path string) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return
	}
	if c, err := net.DialTimeout("unix", path, 100*time.Millisecond); err == nil {
		c.Close()
		return
	}
	os.Remove(path)
}

// Addrs returns the addresses the server listens on, in Config.Listen
// order.
func (s *Server) Addrs() []net.Addr {
	a := make([]net.Addr, len(s.lns))
	for i, l := range s.lns {
		a[i] = l.Addr()
	}
	return a
}

// Node returns the gossip node, e.g. to Join or Leave peers at run time.
func (s *Server) Node() *gossip.Node { return s.node }

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	return Stats{Conns: n, Accepted: s.st.conns.Load(), Rejected: s.st.rejected.Load(), Queries: s.st.ok.Load() + s.st.no.Load(),
		Allowed: s.st.ok.Load(), Throttled: s.st.no.Load(), BadQueries: s.st.bad.Load(), Gossip: s.node.Stats()}
}

// Start accepts connections on every listener and starts the gossip
// rounds, in background goroutines, until Shutdown.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return throttle.ErrClosed
	}
	if s.started {
		return nil
	}
	s.started = true
	if err := s.node.Start(); err != nil {
		return err
	}
	for _, ln := range s.lns {
		s.wg.Add(1)
		go s.accept(ln)
		s.log.Info("listening", "network", ln.Addr().Network(), "addr", ln.Addr().String())
	}
	return nil
}

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
		s.mu.Lock()
		if s.closing || len(s.conns) >= s.cfg.MaxConns {
			s.mu.Unlock()
			if s.st.rejected.Add(1)%1000 == 1 {
				s.log.Warn("connection limit reached, closing new connections", "max_conns", s.cfg.MaxConns)
			}
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.st.conns.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	r := bufio.NewReaderSize(c, max(s.cfg.MaxTagLen+2, 16))
	w := bufio.NewWriterSize(c, 1024)
	idle := time.Duration(s.cfg.IdleTimeout)
	for {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(idle))
			if s.stopped.Load() {
				return // Shutdown: everything read has been answered
			}
		}
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || (err == nil && len(line) > s.cfg.MaxTagLen+2) {
			s.st.bad.Add(1)
			s.log.Debug("oversized line, closing", "remote", c.RemoteAddr().String(), "max_tag_len", s.cfg.MaxTagLen)
			w.WriteString(ReplyError)
			w.Flush()
			lingerClose(c)
			return
		}
		if err != nil {
			w.Flush()
			return
		}
		w.WriteString(s.decide(line))
		if w.Buffered() > 900 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
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

// decide answers one line, "\n" included.
func (s *Server) decide(line []byte) string {
	tag := line[:len(line)-1]
	if n := len(tag); n > 0 && tag[n-1] == '\r' {
		tag = tag[:n-1]
	}
	if len(tag) == 0 || len(tag) > s.cfg.MaxTagLen {
		s.st.bad.Add(1)
		return ReplyError
	}
	lim := s.limiter(tag)
	d, err := lim.Allow(context.Background(), string(tag), 1)
	switch {
	case err != nil:
		s.st.bad.Add(1)
		return ReplyError
	case d.Allowed:
		s.st.ok.Add(1)
		return ReplyOK
	default:
		s.st.no.Add(1)
		return ReplyNO
	}
}

// Tokens returns the tokens left for tag in the bucket of the limit it
// matches, negative when peers' reports pushed it below empty.
func (s *Server) Tokens(tag string) int64 { return s.limiter([]byte(tag)).Tokens(tag) }

// Decide answers a query for tag as a connection would ("OK\n", "NO\n" or
// "ER\n"), without a socket.
func (s *Server) Decide(tag string) string { return s.decide([]byte(tag + "\n")) }

func (s *Server) limiter(tag []byte) *gossip.Limiter {
	if l, ok := s.exact[string(tag)]; ok {
		return l
	}
	for _, g := range s.globs {
		if match(g.pattern, tag) {
			return g.lim
		}
	}
	return s.def
}

// Shutdown stops accepting, lets every connection finish the queries it
// has already sent, then closes it, and stops the gossip node. If ctx ends
// first the remaining connections are closed at once. It returns
// ctx.Err() in that case, nil otherwise. Idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closing = true
	s.stopped.Store(true)
	for _, l := range s.lns {
		l.Close()
	}
	// Wake every reader: it answers what it has buffered and stops.
	for c := range s.conns {
		c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-done
	}
	s.node.Close()
	s.log.Info("stopped", "queries", s.st.ok.Load()+s.st.no.Load())
	return err
}
