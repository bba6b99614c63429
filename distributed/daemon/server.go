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
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
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
	ReplyOK    = "OK\n"
	ReplyNO    = "NO\n"
	ReplyError = "ER\n"
	ReplyPong  = "PONG\n"
	// ReplyRefused is sent, before closing, to a connection beyond
	// MaxConns or MaxConnsPerAddr.
	ReplyRefused = "RF\n"
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

// limits are the limiters of one configuration, swapped whole by Reload.
type limits struct {
	exact map[string]bucketLimiter // rules without wildcards
	globs []globRule
	def   bucketLimiter
	all   map[string]bucketLimiter // by gossip name
	burst map[bucketLimiter]int64
	owned bool // routing "owner": the limiters are *gossip.OwnedLimiter
	// prev is the configuration this one replaced, while a changed
	// limit's tags may still carry usage from it (see carry); nil after.
	prev atomic.Pointer[limits]
}

// maxCarry bounds how long a reload keeps the replaced limiters to carry
// their usage over: a bucket refills in burst/rate at most, and usage
// older than this is forgotten.
const maxCarry = 10 * time.Minute

// connLimits are the connection settings Reload may change.
type connLimits struct {
	maxConns, perAddr   int
	idle, write, budget time.Duration
}

type globRule struct {
	pattern string
	lim     bucketLimiter
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

// gossipTransport binds the gossip socket into gc, sealed under the key
// file if there is one, and starts the membership of gossip.members if
// configured.
func (s *Server) gossipTransport(gc *gossip.Config) error {
	g := s.cfg.Gossip
	if err := s.cfg.CheckSecret(); err != nil {
		return err
	}
	if g.Members != nil && g.Membership == nil {
		return fmt.Errorf("%w: gossip.members needs a program that runs a membership (cmd/throttled)", throttle.ErrInvalid)
	}
	gc.Secret, _ = g.secret()
	udp, err := s.listenGossip(g.Listen)
	if err != nil {
		return fmt.Errorf("gossip listen: %w", err)
	}
	gc.Transport = udp
	var keys [][]byte
	if g.KeyFile != "" {
		keys, _ = LoadKeys(g.KeyFile) // checked by CheckSecret
		s.keys = &keyring{keys: keys}
		if s.seal, err = gossip.Seal(udp, s.keys); err != nil {
			udp.Close()
			return err
		}
		gc.Transport = s.seal
	}
	if g.Members != nil {
		ms, closer, err := g.Membership(g, cmp.Or(g.Advertise, udp.Addr()), keys)
		if err != nil {
			udp.Close()
			return fmt.Errorf("gossip membership: %w", err)
		}
		gc.Membership, s.ms = ms, closer
	}
	return nil
}

// listenGossip binds the gossip transport on addr: UDP, or the test
// hook's.
func (s *Server) listenGossip(addr string) (gossip.Transport, error) {
	if s.cfg.hooks != nil && s.cfg.hooks.gossip != nil {
		return s.cfg.hooks.gossip(addr)
	}
	return gossip.ListenUDP(addr)
}

// hooks replace the sockets of a Server, for simulations in memory.
type hooks struct {
	listen func(network, addr string) (net.Listener, error) // the query listeners
	gossip func(addr string) (gossip.Transport, error)      // the gossip transport
}

// closeMembership stops the membership of gossip.members, if any.
func (s *Server) closeMembership() {
	if s.ms != nil {
		s.ms.Close()
	}
}

func connLimitsOf(cfg Config) *connLimits {
	return &connLimits{maxConns: cfg.MaxConns, perAddr: cfg.MaxConnsPerAddr,
		idle: time.Duration(cfg.IdleTimeout), write: time.Duration(cfg.WriteTimeout), budget: time.Duration(cfg.IdleBudget)}
}

// limitName is the gossip name of a limit: its rate and burst are part
// of it, so that daemons whose configurations differ do not charge each
// other, and a reload that changes a limit starts a new one.
func limitName(kind string, l Limit) string {
	return fmt.Sprintf("%s|%s|%d", kind, l.Rate, l.Burst)
}

// buildLimits makes the limiters of cfg, reusing those of old whose name
// (kind, rate and burst) is unchanged.
func (s *Server) buildLimits(cfg Config, old *limits) (*limits, error) {
	l := &limits{exact: map[string]bucketLimiter{}, all: map[string]bucketLimiter{}, burst: map[bucketLimiter]int64{},
		owned: cfg.Gossip.Routing == RoutingOwner}
	var created []bucketLimiter
	newLim := func(kind string, lm Limit) (bucketLimiter, error) {
		name := limitName(kind, lm)
		if x := l.all[name]; x != nil {
			return x, nil
		}
		// Unchanged since the running configuration, or one before it
		// still open to carry usage: the same buckets.
		for o := old; o != nil; o = o.prev.Load() {
			if x := o.all[name]; x != nil {
				l.all[name], l.burst[x] = x, int64(lm.Burst)
				return x, nil
			}
		}
		r, err := throttle.ParseRate(lm.Rate)
		if err != nil {
			return nil, err
		}
		x, err := s.newLimiter(cfg.Gossip, name, r, lm.Burst)
		if err != nil {
			return nil, err
		}
		created = append(created, x)
		l.all[name], l.burst[x] = x, int64(lm.Burst)
		return x, nil
	}
	fail := func(err error) (*limits, error) {
		for _, x := range created {
			x.Close()
		}
		return nil, err
	}
	var err error
	if l.def, err = newLim("default", cfg.Default); err != nil {
		return fail(err)
	}
	for _, r := range cfg.Rules {
		lim, err := newLim("rule:"+r.Pattern, r.Limit)
		if err != nil {
			return fail(fmt.Errorf("rule %q: %w", r.Pattern, err))
		}
		if isLiteral(r.Pattern) {
			if _, dup := l.exact[r.Pattern]; !dup {
				l.exact[r.Pattern] = lim
			}
		} else {
			l.globs = append(l.globs, globRule{r.Pattern, lim})
		}
	}
	return l, nil
}

// Reload applies the limits (default and rules) and the connection
// settings (max_conns, max_conns_per_addr, idle_timeout, idle_budget,
// write_timeout) of cfg. Buckets of limits whose rate and burst are
// unchanged keep their state. A tag whose limit changed keeps its usage:
// its new bucket holds at most the new burst less what the old bucket has
// used, until the old one has refilled (at most maxCarry; over gossip,
// every node charges the usage it saw, so carried usage may count more
// than once meanwhile: stricter, never looser; with routing "owner"
// nothing is carried).
// Queries racing a reload are answered by the old or the new limits,
// never "ER". New gossip peers are joined, and those no longer listed
// left. Settings that need a restart (listeners, the other gossip settings,
// max_tag_len, max_keys, admin) must be unchanged. If cfg is invalid, the running
// configuration stays and the error wraps throttle.ErrInvalid.
func (s *Server) Reload(cfg Config) error {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	err := s.reload(cfg)
	if err != nil {
		s.st.reloadErrors.Add(1)
		s.log.Error("reload refused, keeping the running configuration", "err", err)
		return err
	}
	s.st.reloads.Add(1)
	s.log.Info("configuration reloaded", "default_rate", cfg.Default.Rate, "default_burst", cfg.Default.Burst, "rules", len(cfg.Rules))
	return nil
}

func (s *Server) reload(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.check(); err != nil {
		return err
	}
	fixed := func(c Config) string {
		g := c.Gossip
		g.Interval = 0
		var members Members
		if g.Members != nil {
			members = *g.Members
		}
		return fmt.Sprint(c.Listen, g.Listen, g.Advertise, g.Secret, g.SecretFile, g.SpendCap, g.Copies, g.KeyFile, members, c.MaxTagLen, c.MaxKeys, c.Admin,
			g.Routing, g.ForwardTimeout, g.ForwardDelay, c.StateFile)
	}
	if fixed(cfg) != fixed(s.cfg) || cfg.Gossip.Interval != s.cfg.Gossip.Interval {
		return fmt.Errorf("%w: reload: listen, gossip (but for its peers), max_tag_len, max_keys, admin and state_file need a restart", throttle.ErrInvalid)
	}
	var keys [][]byte
	if cfg.Gossip.KeyFile != "" && s.keys != nil {
		var err error
		if keys, err = LoadKeys(cfg.Gossip.KeyFile); err != nil {
			return err
		}
	}
	old := s.lim.Load()
	l, err := s.buildLimits(cfg, old)
	if err != nil {
		return err
	}
	if err := s.setPeers(cfg.Gossip.Peers); err != nil {
		return err
	}
	if keys != nil {
		s.keys.set(keys)
	}
	// The previous configurations stay open, in a chain of at most
	// maxChain, while their usage may carry over: for the longest refill
	// time of their limits, at most maxCarry.
	var carry time.Duration
	for _, x := range old.all {
		r, _ := throttle.ParseRate(limitRate(x))
		carry = max(carry, r.Duration(old.burst[x]))
	}
	l.prev.Store(old)
	s.lim.Store(l)
	s.conf.Store(connLimitsOf(cfg))
	o := old
	for range maxChain - 1 {
		if o = o.prev.Load(); o == nil {
			break
		}
	}
	if o != nil {
		s.dropPrev(o)
	}
	time.AfterFunc(min(carry, maxCarry), func() {
		s.relMu.Lock()
		defer s.relMu.Unlock()
		s.dropPrev(l)
	})
	return nil
}

// setPeers makes the gossip node's static peers those listed: it joins
// the new ones and leaves those no longer listed (whose hits stay charged).
// Peers found by memberlist (gossip.members) are its business, not this.
func (s *Server) setPeers(peers []string) error {
	if s.cfg.Gossip.Listen == "" || s.cfg.Gossip.Members != nil {
		return nil
	}
	for _, p := range peers {
		if err := s.node.Join(p); err != nil {
			return err
		}
	}
	for _, p := range s.node.Peers() {
		if !slices.Contains(peers, p) {
			s.node.Leave(p)
		}
	}
	return nil
}

// maxChain bounds the configurations kept to carry usage over reloads.
const maxChain = 16

// dropPrev ends l's carrying of usage: the configurations before l are
// forgotten, and their limiters that the running ones no longer use are
// closed. Called under relMu.
func (s *Server) dropPrev(l *limits) {
	inUse := map[bucketLimiter]bool{}
	for c := s.lim.Load(); c != nil && c != l; c = c.prev.Load() {
		for _, x := range c.all {
			inUse[x] = true
		}
	}
	for _, x := range l.all {
		inUse[x] = true
	}
	for o := l.prev.Swap(nil); o != nil; o = o.prev.Swap(nil) {
		for _, x := range o.all {
			if !inUse[x] {
				x.Close()
			}
		}
	}
}

// limitRate returns the rate of x, from its gossip name (see limitName).
func limitRate(x bucketLimiter) string {
	name := x.Name()
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '|' {
			name = name[:i]
			break
		}
	}
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '|' {
			return name[i+1:]
		}
	}
	return ""
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
	n := s.all.n
	s.mu.Unlock()
	return Stats{Conns: n, Accepted: s.st.conns.Load(), Rejected: s.st.rejected.Load(), Reclaimed: s.st.reclaimed.Load(), Queries: s.st.ok.Load() + s.st.no.Load(),
		Allowed: s.st.ok.Load(), Throttled: s.st.no.Load(), BadQueries: s.st.bad.Load(), Pings: s.st.pings.Load(),
		WriteTimeouts: s.st.writeTimeouts.Load(), ReplyResets: s.st.replyResets.Load(), Reloads: s.st.reloads.Load(), ReloadErrors: s.st.reloadErrors.Load(),
		Gossip: s.node.Stats(), Unsealed: s.unsealed(), Owned: s.lim.Load().ownedStats()}
}

func (s *Server) unsealed() uint64 {
	if s.seal == nil {
		return 0
	}
	return s.seal.Refused()
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

// AdminAddr returns the address of the admin HTTP listener, or nil.
func (s *Server) AdminAddr() net.Addr {
	if s.adminLn == nil {
		return nil
	}
	return s.adminLn.Addr()
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
		io.WriteString(c, ReplyRefused)
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
	c.Write(append(out, ReplyError...))
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

// Tokens returns the tokens left for tag in the bucket of the limit it
// matches, negative when peers' reports pushed it below empty. With
// routing "owner" it is this daemon's bucket of tag: the owner's exact
// one if this daemon owns tag, else its fallback bucket.
func (s *Server) Tokens(tag string) int64 { return s.limiter([]byte(tag)).Tokens(tag) }

// Decide answers a query for tag as a connection would ("OK\n", "NO\n" or
// "ER\n"), without a socket.
func (s *Server) Decide(tag string) string { return string(s.answer([]byte(tag+"\n"), nil)) }

func (s *Server) limiter(tag []byte) bucketLimiter { return s.lim.Load().limiter(tag) }

// carry keeps the usage key had under the configurations before l, when
// its limit changed: before each decision, while they are kept, lim's
// bucket is brought down to at most the tokens l.tokens allows. Racing
// decisions may each charge: stricter, never looser. It costs one atomic
// load when l carries nothing. With routing "owner" nothing is carried: a
// tag whose limit changed starts on a full bucket of the new limit.
func (l *limits) carry(lim bucketLimiter, key string) {
	if l.prev.Load() == nil || l.owned {
		return // an owner-routed tag's bucket is on its owner
	}
	have := lim.Tokens(key)
	if k := have - max(l.tokens(lim, key, maxChain), 0); k > 0 {
		lim.Allow(context.Background(), key, int(min(k, have)))
	}
}

// tokens returns the tokens key may have in lim, its limiter under l:
// those of its bucket, at most lim's burst less what key's bucket had
// used under the previous configuration (itself so bounded, depth
// configurations back). The old buckets refill at their old rates, so
// carried usage fades as it would have.
func (l *limits) tokens(lim bucketLimiter, key string, depth int) int64 {
	have := lim.Tokens(key)
	p := l.prev.Load()
	if p == nil || depth == 0 {
		return have
	}
	old := p.limiter([]byte(key))
	if old == lim {
		return min(have, p.tokens(old, key, depth-1))
	}
	used := p.burst[old] - p.tokens(old, key, depth-1)
	return min(have, l.burst[lim]-used)
}

func (l *limits) limiter(tag []byte) bucketLimiter {
	if x, ok := l.exact[string(tag)]; ok {
		return x
	}
	for _, g := range l.globs {
		if match(g.pattern, tag) {
			return g.lim
		}
	}
	return l.def
}

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

// watchGossip logs, loudly, gossip datagrams dropped since the last look,
// with the misconfiguration each cause usually means: a silent gossip is
// a cluster that limits N times too much.
func (s *Server) watchGossip(stop <-chan struct{}, every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var last gossip.Stats
	var lastUnsealed uint64
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		g, unsealed := s.node.Stats(), s.unsealed()
		for _, c := range []struct {
			n    uint64
			what string
		}{
			{unsealed - lastUnsealed, "unsealed: opened under no key of gossip.key_file (a key rotation out of order, or forged)"},
			{g.BadMAC - last.BadMAC, "bad_mac: authentication failed (peers with another gossip secret, or forged)"},
			{g.UnknownSender - last.UnknownSender, "unknown_sender: authentic, from a node not in gossip.peers (its advertise address differs from our peers list?)"},
			{g.WrongSource - last.WrongSource, "wrong_source: authentic, from another address than the peer is listed under (NAT, or a wildcard bind sending from another interface?)"},
			{g.Malformed - last.Malformed, "malformed: not a gossip datagram of this version"},
			{g.UnknownTable - last.UnknownTable, "unknown_table: a limit this daemon does not have (rules or limits differ between daemons)"},
			{g.Capped - last.Capped, "capped: peers reported more hits than they could have admitted (limits differ, or a misbehaving peer)"},
		} {
			if c.n > 0 {
				s.log.Warn("gossip datagrams dropped", "count", c.n, "cause", c.what)
			}
		}
		if g.Behind > last.Behind {
			s.log.Warn("gossip rounds cannot carry every changed tag: charges lag the decisions", "rounds", g.Behind-last.Behind,
				"hint", "every hit is still charged (long-run rate exact for tags in steady use), but a tag asked on every daemon before its charges arrive gets up to a burst and the lag's refill on each: use routing \"owner\" for this many active tags")
		}
		if g.PacketsReceived == last.PacketsReceived && len(s.node.Peers()) > 0 && g.Rounds > 10 {
			s.log.Warn("no gossip received from any peer lately", "peers", s.node.Peers(), "advertise", s.node.ID())
		}
		last, lastUnsealed = g, unsealed
	}
}
