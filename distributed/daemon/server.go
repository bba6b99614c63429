// Package daemon is the server side of the throttled line protocol, as a
// library: one instance per host answers "serve or throttle this tag?"
// for many local workers, deciding locally with a gossip-adjusted token
// bucket (package gossip) that peers on other hosts keep in step.
//
//	cfg := daemon.DefaultConfig()
//	cfg.Listen = []string{"unix:/run/throttled.sock"}
//	cfg.Default = daemon.Limit{Rate: "10/s", Burst: 20}
//	s, err := daemon.New(cfg, slog.Default())
//	err = s.Start()
//	defer s.Shutdown(ctx)
//
// # Protocol
//
// A client connects over TCP or a Unix socket and sends a tag followed by
// "\n" (a trailing "\r" is ignored). The reply is exactly three bytes:
// "OK\n" (serve), "NO\n" (throttle), or "ER\n" for a malformed query: an
// empty tag keeps the connection open, a line longer than MaxTagLen closes
// it. Connections are reused for any number of queries, and queries may
// be pipelined: replies come back in order, and the replies to every
// complete line the server has read are sent before it reads again (a
// write that ends mid-line does not hold back the replies to the lines
// before). A bad line affects only its own connection.
//
// Two more line forms, which a plain client never needs: "PING\n" is
// answered "PONG\n" without spending a token (a health check), and
// "?tag\n" is the query of tag with a detailed reply,
// "OK remaining retry_ms reset_ms\n" or "NO remaining retry_ms reset_ms\n":
// the tokens left, the wait before a retry may succeed (0 when admitted)
// and the time until the bucket is full, in milliseconds. So the tag
// "PING" and tags that begin with "?" cannot be queried in the plain form.
//
// Each tag is charged one token of the limit of the first rule whose
// pattern it matches (or the default limit). With gossip peers, every
// daemon is charged for the hits of all daemons, one gossip interval
// late; see package gossip for the guarantees. With Gossip.Routing
// "owner", each tag is decided by one daemon, its owner, to which the
// others forward their queries: the complete lines of one read are
// decided together, one round trip for the lot.
//
// # Connections and memory
//
// A connection is idle when no byte arrives for Config.IdleTimeout; a
// client that sends, however slowly, is never idle. Replies a client
// does not take wait in a send buffer of 16 KiB: when it is full the
// server reads no more of that connection's queries, and a connection
// that takes none of its replies for Config.WriteTimeout (while sending,
// or idle with replies waiting) is reset, as is an idle one: a reset
// frees the kernel's buffers at once, where a normal close would keep
// unsent replies in an orphan socket for minutes. So a client that
// never reads pins at most its send buffer and the receive buffers for
// WriteTimeout.
//
// A connection beyond Config.MaxConns, or beyond Config.MaxConnsPerAddr
// from one client (one IP address over TCP, one process over a Unix
// socket, known by SO_PEERCRED), takes the place of the longest-idle
// connection under that cap if one has received nothing for
// Config.IdleBudget: that one is closed (after answering any query
// that arrived meanwhile), as an idle timeout would; the Go client
// retries on a fresh connection. Otherwise the new connection gets
// "RF\n" and is closed: the Go client reports it as client.ErrRefused,
// apart from a daemon that is down. A connection that sent anything
// within Config.IdleBudget is never closed for another, with one
// exception: local processes share a loopback address's cap. On Linux, a
// connection from a loopback address that finds its cap full takes the
// place of the longest-idle connection of the process that holds the
// most, if that process holds at least two more than the new
// connection's (processes found through /proc, at most once per 50 ms,
// among those of the daemon's user), so that one busy process cannot
// lock the other local processes out. Local workers should prefer the
// Unix socket, where each process has its own cap.
//
// On Shutdown (SIGTERM for throttled) the server stops accepting, answers
// every query a connection had received before it (read or still in the
// socket's receive buffer, on Linux), and closes the connection; the
// caller's context bounds it all.
package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Replies of the protocol.
const (
	replyOK    = "OK\n"
	replyNO    = "NO\n"
	replyError = "ER\n"
	replyPong  = "PONG\n"
	// replyRefused is sent, before closing, to a connection beyond
	// MaxConns or MaxConnsPerAddr.
	replyRefused = "RF\n"
)

// Server answers queries on its listeners. Create it with New, run it with
// Start, stop it with Shutdown. All methods are safe for concurrent use.
// The zero value is not usable.
type Server struct {
	cfg   Config // the listeners and gossip settings; limits are in lim
	log   *slog.Logger
	clk   clock.Source // the limiters' clock
	node  *gossip.Node
	keys  *keyring                // gossip.key_file's keys; nil without
	seal  *gossip.SealedTransport // nil without a key file
	ms    io.Closer               // the membership of gossip.members; nil without
	lim   atomic.Pointer[limits]
	conf  atomic.Pointer[connLimits]
	relMu sync.Mutex // serializes Reload

	lns       []net.Listener
	watchStop chan struct{}
	admin     *http.Server
	adminLn   net.Listener

	mu        sync.Mutex
	all       connList             // every connection
	peers     map[string]*connList // the connections of each client (peerKey)
	epoch     time.Time            // of conn.last
	closing   bool
	started   bool
	stopped   atomic.Bool  // closing, readable without mu
	lingering atomic.Int64 // refused connections being closed
	shareAt   atomic.Int64 // when shareLoopback last looked up processes (see now)
	wg        sync.WaitGroup

	st struct {
		conns, rejected, reclaimed, queries, ok, no, bad, pings, writeTimeouts, replyResets, reloads, reloadErrors atomic.Uint64
	}
}

// Stats counts what a Server did.
type Stats struct {
	Conns    int    // connections open now
	Accepted uint64 // connections accepted in all
	Rejected uint64 // connections closed at once: MaxConns or MaxConnsPerAddr reached
	// Reclaimed counts idle connections closed to make room for a new
	// one at MaxConns or MaxConnsPerAddr (see Config.IdleBudget).
	Reclaimed  uint64
	Queries    uint64 // well-formed queries answered
	Allowed    uint64 // of which "OK"
	Throttled  uint64 // of which "NO"
	BadQueries uint64 // lines answered "ER"
	Pings      uint64 // "PING" lines answered
	// WriteTimeouts counts connections closed because their replies
	// could not be written for WriteTimeout.
	WriteTimeouts uint64
	// ReplyResets counts connections reset because, idle, they left
	// replies untaken for WriteTimeout.
	ReplyResets  uint64
	Reloads      uint64 // configurations applied by Reload
	ReloadErrors uint64 // configurations Reload refused
	Gossip       gossip.Stats
	// Unsealed counts gossip datagrams refused because they opened under
	// no key of gossip.key_file: forged, or sealed under a key this
	// daemon lacks (a rotation done out of order).
	Unsealed uint64
	// Owned sums the counters of the owner-routed limits in use (routing
	// "owner"; zero otherwise).
	Owned gossip.OwnedStats
}

// New validates cfg with its defaults (WithDefaults), creates the gossip node and its limiters, and binds
// every listener (so Addrs is known before Start). opts (throttle.WithClock,
// WithMaxKeys, ...) apply to the limiters. log may be nil (discard).
func New(cfg Config, log *slog.Logger, opts ...throttle.Option) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	settings, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, clk: clock.New(settings.Clock), all: connList{k: 0}, peers: map[string]*connList{}, epoch: time.Now()}
	s.conf.Store(connLimitsOf(cfg))
	gc := gossip.Config{ID: cfg.Gossip.Advertise, Peers: cfg.Gossip.Peers, Interval: time.Duration(cfg.Gossip.Interval), SpendCap: cfg.Gossip.SpendCap, Copies: cfg.Gossip.Copies}
	if cfg.Gossip.Listen != "" {
		if err := s.gossipTransport(&gc); err != nil {
			return nil, err
		}
	}
	opts = append([]throttle.Option{throttle.WithMaxKeyLen(cfg.MaxTagLen), throttle.WithMaxKeys(cfg.MaxKeys)}, opts...)
	node, err := gossip.NewNode(gc, opts...)
	if err != nil {
		if gc.Transport != nil {
			gc.Transport.Close()
		}
		s.closeMembership()
		return nil, err
	}
	s.node = node
	fail := func(err error) (*Server, error) {
		for _, l := range s.lns {
			l.Close()
		}
		node.Close()
		s.closeMembership()
		return nil, err
	}
	lim, err := s.buildLimits(cfg, nil)
	if err != nil {
		return fail(err)
	}
	s.lim.Store(lim)
	if n, err := s.restoreState(lim); err != nil {
		log.Warn("state file not restored: every tag starts full", "err", err)
	} else if n > 0 {
		log.Info("state restored", "tags", n, "file", cfg.StateFile)
	}
	if err := s.listen(cfg); err != nil {
		return fail(err)
	}
	return s, nil
}

// listen binds the listeners of cfg.Listen and the admin listener, if any.
func (s *Server) listen(cfg Config) error {
	for _, l := range cfg.Listen {
		network, addr, _ := splitListen(l)
		if network == "unix" {
			removeStaleSocket(addr)
		}
		listen := net.Listen
		if s.cfg.hooks != nil && s.cfg.hooks.listen != nil {
			listen = s.cfg.hooks.listen
		}
		ln, err := listen(network, addr)
		if err != nil {
			return err
		}
		s.lns = append(s.lns, ln)
	}
	if cfg.Admin != "" {
		ln, err := net.Listen("tcp", cfg.Admin)
		if err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		s.adminLn = ln
		s.admin = &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	}
	return nil
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
	n := s.all.n
	s.mu.Unlock()
	return Stats{Conns: n, Accepted: s.st.conns.Load(), Rejected: s.st.rejected.Load(), Reclaimed: s.st.reclaimed.Load(), Queries: s.st.ok.Load() + s.st.no.Load(),
		Allowed: s.st.ok.Load(), Throttled: s.st.no.Load(), BadQueries: s.st.bad.Load(), Pings: s.st.pings.Load(),
		WriteTimeouts: s.st.writeTimeouts.Load(), ReplyResets: s.st.replyResets.Load(), Reloads: s.st.reloads.Load(), ReloadErrors: s.st.reloadErrors.Load(),
		Gossip: s.node.Stats(), Unsealed: s.unsealed(), Owned: s.lim.Load().ownedStats()}
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
	if s.cfg.Gossip.Listen != "" {
		s.watchStop = make(chan struct{})
		s.wg.Add(1)
		go s.watchGossip(s.watchStop, max(5*s.node.Interval(), 50*time.Millisecond))
	}
	if s.admin != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.admin.Serve(s.adminLn)
		}()
		s.log.Info("admin listening", "addr", s.adminLn.Addr().String(), "paths", "/healthz /metrics")
	}
	return nil
}

// adminAddr returns the address of the admin HTTP listener, or nil.
func (s *Server) adminAddr() net.Addr {
	if s.adminLn == nil {
		return nil
	}
	return s.adminLn.Addr()
}

// tagTokens returns the tokens left for tag in the bucket of the limit it
// matches, negative when peers' reports pushed it below empty. With
// routing "owner" it is this daemon's bucket of tag: the owner's exact
// one if this daemon owns tag, else its fallback bucket.
func (s *Server) tagTokens(tag string) int64 { return s.limiter([]byte(tag)).Tokens(tag) }

// Decide answers a query for tag as a connection would ("OK\n", "NO\n" or
// "ER\n"), without a socket.
func (s *Server) Decide(tag string) string { return string(s.answer([]byte(tag+"\n"), nil)) }

// Shutdown stops accepting, lets every connection answer the queries it
// had received (on Linux, also those still in the socket's receive
// buffer), then closes it, and stops the gossip node. If ctx ends
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
	if s.watchStop != nil {
		close(s.watchStop)
	}
	for _, l := range s.lns {
		l.Close()
	}
	// Wake every reader: it answers what it has buffered and stops. A
	// writer blocked on a client that does not read gives up soon.
	for c := s.all.head; c != nil; c = c.links[0].next {
		c.c.SetReadDeadline(time.Now())
		c.c.SetWriteDeadline(time.Now().Add(shutdownWrite))
	}
	s.mu.Unlock()
	if s.admin != nil {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		s.admin.Shutdown(actx)
		cancel()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for c := s.all.head; c != nil; c = c.links[0].next {
			c.c.Close()
		}
		s.mu.Unlock()
		<-done
	}
	if err := s.saveState(); err != nil {
		s.log.Error("state not saved: the next start gives every tag a full bucket", "err", err)
	}
	s.node.Close()
	s.closeMembership()
	s.log.Info("stopped", "queries", s.st.ok.Load()+s.st.no.Load())
	return err
}
