package gossip

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
)

// Defaults and bounds of Config.
const (
	DefaultInterval = time.Second
	MinInterval     = time.Millisecond
	DefaultResend   = 3
	// DefaultAntiEntropy is the default of Config.AntiEntropy.
	DefaultAntiEntropy = 5
	// MinSecretLen is the shortest shared secret NewNode accepts.
	MinSecretLen = 16
)

// Config configures a Node. The zero value of each field except
// Transport and Secret selects its default.
type Config struct {
	// Transport carries the gossip. Nil makes a standalone node that
	// never gossips (useful for a single host, or tests); then Peers must
	// be empty. The node owns the transport and closes it in Close.
	Transport Transport
	// Secret is the shared key that authenticates every datagram with
	// HMAC-SHA256: at least MinSecretLen bytes, the same on every node.
	Secret []byte
	// ID is the address the peers send to and know this node by: it must
	// be the string in their Peers lists. Default Transport.Addr(), which
	// is right for a specific address ("10.0.0.5:7946") but not for a
	// wildcard bind ("0.0.0.0:7946"): set ID then.
	ID string
	// Peers are the addresses of the other nodes (their IDs). Join and
	// Leave change the set at run time.
	Peers []string
	// Interval is the gossip period: every Interval, aligned on multiples
	// of Interval since the Unix epoch, each node reports its hits to
	// every peer. Default DefaultInterval, at least MinInterval.
	Interval time.Duration
	// SpendCap bounds what each node may admit for a key within one
	// interval to its share, weighted by the demand every node reported,
	// of the tokens left. It bounds the cluster-wide burst close to the
	// configured burst instead of N times it, at the price of denying
	// some requests that an uncapped node would have admitted while
	// tokens sit unused on other nodes (they are not lost: the bucket
	// keeps them).
	SpendCap bool
	// Resend is how many consecutive rounds a changed counter is sent
	// again, so that a lost datagram is repaired by the next one.
	// Default DefaultResend.
	Resend int
	// AntiEntropy is how often, in rounds, a node sends every live
	// counter to every peer, repairing what all the resends of a change
	// failed to deliver. Default DefaultAntiEntropy; negative disables.
	AntiEntropy int
}

// Stats counts what a Node did. Read it with Node.Stats.
type Stats struct {
	Rounds          uint64 // gossip rounds run
	PacketsSent     uint64 // datagrams sent
	BytesSent       uint64 // bytes in those datagrams
	SendErrors      uint64 // datagrams the transport refused
	PacketsReceived uint64 // datagrams received and accepted
	Malformed       uint64 // datagrams dropped: not a well-formed message
	BadMAC          uint64 // datagrams dropped: authentication failed
	UnknownSender   uint64 // authentic datagrams from a non-member
	Stale           uint64 // datagrams from an earlier incarnation of a peer
	UnknownTable    uint64 // reports for a limiter this node does not have
	HitsApplied     uint64 // units debited because peers reported them
	Overflow        uint64 // keys not tracked for gossip because MaxKeys was reached
	FullSyncs       uint64 // full dumps sent to a peer that came back or restarted
}

type stats struct {
	rounds, sent, bytes, sendErr, recv, malformed, badMAC, unknown, stale, unknownTable, applied, overflow, full atomic.Uint64
}

// Node is one member of a gossip cluster. It owns a Transport and any
// number of Limiters (one per limit, each with its own name), and runs the
// gossip rounds. All methods are safe for concurrent use.
type Node struct {
	cfg         Config
	settings    throttle.Settings
	clk         clock.Source
	id          string
	incarnation uint64
	interval    int64
	created     int64

	members atomic.Pointer[[]string] // sorted IDs of self and peers
	tick    atomic.Int64             // rounds run, plus one: marks when counters change

	mu       sync.Mutex // guards the fields below
	peers    map[string]*peer
	limiters map[string]*Limiter
	round    int64
	sendSig  *signer
	closed   bool
	stop     chan struct{}
	started  bool

	rmu     sync.Mutex // guards recvSig
	recvSig *signer

	wg sync.WaitGroup
	st stats
}

type peer struct {
	addr        string
	acceptFrom  int64 // counters born before this (ns) are baselined, not debited
	incarnation uint64
	lastHeard   int64
	needFull    bool // send every live counter next round
	needState   bool // send bucket levels next round (peer is new or restarted)
}

// NewNode validates cfg and returns a node that listens on cfg.Transport
// at once. It gossips when Tick is called; Start calls Tick on a timer.
// opts set the clock and the bounds on keys for every limiter of the node.
// Errors wrap throttle.ErrInvalid.
func NewNode(cfg Config, opts ...throttle.Option) (*Node, error) {
	s, err := throttle.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Resend == 0 {
		cfg.Resend = DefaultResend
	}
	if cfg.AntiEntropy == 0 {
		cfg.AntiEntropy = DefaultAntiEntropy
	}
	switch {
	case cfg.Interval < MinInterval:
		return nil, fmt.Errorf("%w: gossip interval %v is below %v", throttle.ErrInvalid, cfg.Interval, MinInterval)
	case cfg.Resend < 1 || cfg.Resend > 1000:
		return nil, fmt.Errorf("%w: Resend %d out of [1, 1000]", throttle.ErrInvalid, cfg.Resend)
	case cfg.Transport == nil && len(cfg.Peers) > 0:
		return nil, fmt.Errorf("%w: peers need a Transport", throttle.ErrInvalid)
	case cfg.Transport != nil && len(cfg.Secret) < MinSecretLen:
		return nil, fmt.Errorf("%w: gossip secret must be at least %d bytes", throttle.ErrInvalid, MinSecretLen)
	}
	n := &Node{
		cfg: cfg, settings: s, clk: clock.New(s.Clock), interval: int64(cfg.Interval),
		peers: map[string]*peer{}, limiters: map[string]*Limiter{},
		sendSig: newSigner(cfg.Secret), recvSig: newSigner(cfg.Secret),
	}
	n.created = n.clk.Now()
	n.tick.Store(1)
	n.incarnation = uint64(time.Now().UnixNano())
	if s.Clock != nil {
		// Virtual time: keep simulations reproducible.
		n.incarnation = uint64(n.created)
	}
	n.id = cfg.ID
	if n.id == "" && cfg.Transport != nil {
		n.id = cfg.Transport.Addr()
	}
	if n.id == "" {
		n.id = "standalone"
	}
	if len(n.id) > maxName {
		return nil, fmt.Errorf("%w: node ID longer than %d bytes", throttle.ErrInvalid, maxName)
	}
	for _, p := range cfg.Peers {
		if err := n.addPeer(p); err != nil {
			return nil, err
		}
	}
	n.publishMembers()
	if cfg.Transport != nil {
		if err := cfg.Transport.Listen(n.handle); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// ID returns the node's ID: Config.ID, or its transport address.
func (n *Node) ID() string { return n.id }

// Interval returns the gossip period.
func (n *Node) Interval() time.Duration { return time.Duration(n.interval) }

func (n *Node) addPeer(addr string) error {
	if addr == "" || len(addr) > maxName {
		return fmt.Errorf("%w: peer address %q", throttle.ErrInvalid, addr)
	}
	if addr == n.id {
		return nil
	}
	if _, ok := n.peers[addr]; ok {
		return nil
	}
	// Counters born up to one interval before we started listening to
	// the peer are news to us: they allow for clock skew.
	n.peers[addr] = &peer{addr: addr, acceptFrom: n.clk.Now() - n.interval, needFull: true}
	return nil
}

func (n *Node) publishMembers() {
	m := []string{n.id}
	for a := range n.peers {
		m = append(m, a)
	}
	slices.Sort(m)
	n.members.Store(&m)
}

// Join adds a peer at run time. The node sends it every live counter and
// its bucket levels at the next round, and counts the peer's hits from
// now on. Errors wrap throttle.ErrInvalid or throttle.ErrClosed.
func (n *Node) Join(addr string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return throttle.ErrClosed
	}
	if n.cfg.Transport == nil {
		return fmt.Errorf("%w: a standalone node cannot have peers", throttle.ErrInvalid)
	}
	if err := n.addPeer(addr); err != nil {
		return err
	}
	n.publishMembers()
	return nil
}

// Leave removes a peer: its reports are no longer accepted and it no
// longer counts in spend-cap shares. Hits it reported stay charged.
func (n *Node) Leave(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.peers, addr)
	n.publishMembers()
}

// Peers returns the current peer addresses, sorted.
func (n *Node) Peers() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := make([]string, 0, len(n.peers))
	for a := range n.peers {
		p = append(p, a)
	}
	slices.Sort(p)
	return p
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		Rounds: n.st.rounds.Load(), PacketsSent: n.st.sent.Load(), BytesSent: n.st.bytes.Load(),
		SendErrors: n.st.sendErr.Load(), PacketsReceived: n.st.recv.Load(), Malformed: n.st.malformed.Load(),
		BadMAC: n.st.badMAC.Load(), UnknownSender: n.st.unknown.Load(), Stale: n.st.stale.Load(),
		UnknownTable: n.st.unknownTable.Load(), HitsApplied: n.st.applied.Load(), Overflow: n.st.overflow.Load(),
		FullSyncs: n.st.full.Load(),
	}
}

// Start runs Tick at every round boundary on a background goroutine
// until Close. Simulations on virtual time call Tick themselves instead.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return throttle.ErrClosed
	}
	if n.started {
		return nil
	}
	n.started = true
	n.stop = make(chan struct{})
	n.wg.Add(1)
	go n.loop(n.stop)
	return nil
}

func (n *Node) loop(stop chan struct{}) {
	defer n.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n.Tick()
		now := n.clk.Now()
		next := (now/n.interval + 1) * n.interval
		t.Reset(time.Duration(next-now) + time.Millisecond/4)
	}
}

// Close stops the node: the background round, the transport and every
// limiter of the node. It is idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	if n.started {
		close(n.stop)
	}
	lims := make([]*Limiter, 0, len(n.limiters))
	for _, l := range n.limiters {
		lims = append(lims, l)
	}
	n.mu.Unlock()
	n.wg.Wait()
	var err error
	if n.cfg.Transport != nil {
		err = n.cfg.Transport.Close()
	}
	for _, l := range lims {
		err = errors.Join(err, l.Close())
	}
	return err
}

// Tick runs one gossip round if a round boundary has passed since the
// last one, and reports whether it did. A round sends, to every peer, the
// counters that changed in the last Resend rounds (all live counters to a
// peer that restarted or was unreachable, and bucket levels to a new
// peer), a hello to peers that got nothing else, and drops idle state.
func (n *Node) Tick() bool {
	now := n.clk.Now()
	r := now / n.interval
	n.mu.Lock()
	if n.closed || r <= n.round {
		n.mu.Unlock()
		return false
	}
	n.round = r
	// Nodes take their anti-entropy rounds at different offsets.
	everything := n.cfg.AntiEntropy > 0 && (uint64(r)+tieHash(n.id, 0, ""))%uint64(n.cfg.AntiEntropy) == 0
	var normal, full, state []string
	for _, p := range n.peers {
		switch {
		case p.needFull || everything:
			full = append(full, p.addr)
			p.needFull = false
		default:
			normal = append(normal, p.addr)
		}
		if p.needState {
			state = append(state, p.addr)
			p.needState = false
		}
	}
	lims := make([]*Limiter, 0, len(n.limiters))
	for _, l := range n.limiters {
		lims = append(lims, l)
	}
	n.mu.Unlock()
	t := n.tick.Add(1)
	n.st.rounds.Add(1)
	n.st.full.Add(uint64(len(full)))

	got := map[string]bool{}
	for _, l := range lims {
		recent, all, levels := l.collect(r, t, len(full) > 0, len(state) > 0)
		n.sendAll(recent, normal, got)
		n.sendAll(all, full, got)
		n.sendAll(levels, state, got)
	}
	if n.cfg.Transport != nil {
		var hello [][]byte
		for _, a := range append(normal, full...) {
			if got[a] {
				continue
			}
			if hello == nil {
				hello = n.encode(msgHello, "", r, func(*encoder) {})
			}
			n.sendAll(hello, []string{a}, got)
		}
	}
	return true
}

func (n *Node) encode(typ byte, table string, r int64, fill func(*encoder)) [][]byte {
	if n.cfg.Transport == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e := &encoder{sig: n.sendSig, hdr: header{typ: typ, sender: n.id, table: table, incarnation: n.incarnation, round: uint64(r)}}
	fill(e)
	return e.finish()
}

func (n *Node) sendAll(pkts [][]byte, to []string, got map[string]bool) {
	for _, a := range to {
		for _, p := range pkts {
			if err := n.cfg.Transport.Send(a, p); err != nil {
				n.st.sendErr.Add(1)
				continue
			}
			n.st.sent.Add(1)
			n.st.bytes.Add(uint64(len(p)))
			got[a] = true
		}
	}
}

// handle receives one datagram from the transport.
func (n *Node) handle(p []byte) {
	n.rmu.Lock()
	m, err := decode(n.recvSig, p, MaxKeyLen)
	n.rmu.Unlock()
	switch {
	case errors.Is(err, errMAC):
		n.st.badMAC.Add(1)
		return
	case err != nil:
		n.st.malformed.Add(1)
		return
	}
	now := n.clk.Now()
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	pr := n.peers[m.sender]
	if pr == nil {
		n.mu.Unlock()
		n.st.unknown.Add(1)
		return
	}
	if m.incarnation < pr.incarnation {
		n.mu.Unlock()
		n.st.stale.Add(1)
		return
	}
	if m.incarnation > pr.incarnation {
		// A new peer, or one that restarted. If it started well after
		// this node, it missed history that its fresh buckets lack: send
		// it our bucket levels. (Nodes of a cluster started together do
		// not exchange levels, which would count hits twice.)
		if m.incarnation > n.incarnation+uint64(n.interval) {
			pr.needState = true
		}
		pr.incarnation = m.incarnation
		pr.needFull = true
	} else if now-pr.lastHeard > int64(n.cfg.Resend)*n.interval {
		// Back from a partition or a burst of losses: resend everything.
		pr.needFull = true
	}
	pr.lastHeard = now
	acceptFrom := pr.acceptFrom
	var l *Limiter
	if m.typ != msgHello {
		l = n.limiters[m.table]
	}
	n.mu.Unlock()
	n.st.recv.Add(1)
	if m.typ == msgHello {
		return
	}
	if l == nil {
		n.st.unknownTable.Add(1)
		return
	}
	switch m.typ {
	case msgReport:
		n.st.applied.Add(uint64(l.applyReport(m, acceptFrom, n.tick.Load())))
	case msgState:
		l.applyState(m)
	}
}
