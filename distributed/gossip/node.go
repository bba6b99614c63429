package gossip

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Defaults and bounds of Config.
const (
	DefaultInterval = time.Second
	MinInterval     = time.Millisecond
	DefaultResend   = 1
	DefaultCopies   = 2
	// MaxCopies bounds Config.Copies.
	MaxCopies = 8
	// MinSecretLen is the shortest shared secret NewNode accepts.
	MinSecretLen = 16
	// DefaultMaxRoundBytes is the default of Config.MaxRoundBytes: about
	// 100,000 short keys.
	DefaultMaxRoundBytes = 2 << 20
	// MaxMaxRoundBytes bounds Config.MaxRoundBytes: a round's datagrams
	// to a peer are numbered in 16 bits, and a round of that many bytes
	// of reports and levels takes at most about 44,000 datagrams, even
	// with the longest node ID and limiter name (a round cut at 65,535
	// datagrams, as acknowledged in full, would lose the rest).
	MaxMaxRoundBytes = 16 << 20
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
	// It may be empty if the Transport authenticates every datagram
	// itself (it has a method Authenticated() bool that returns true, as
	// a SealedTransport does): the MAC then still binds each datagram to
	// its receiver.
	Secret []byte
	// ID is the address the peers send to and know this node by: it must
	// be the string in their Peers lists. Default Transport.Addr(), which
	// is right for a specific address ("10.0.0.5:7946") but not for a
	// wildcard bind ("0.0.0.0:7946"): set ID then.
	ID string
	// Peers are the addresses of the other nodes (their IDs). Join and
	// Leave change the set at run time.
	Peers []string
	// Membership tells the node who its peers are and when they join,
	// die or leave (a failure detector's dead members leave the
	// spend-cap shares at once), and may set the node's ID and
	// incarnation (Membership.Local). Nil: a StaticMembership of Peers.
	// With a Membership, Peers must be empty. Join and Leave still work.
	Membership Membership
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
	// even before the peer acknowledges it. Counters are resent anyway
	// until a peer acknowledges a round it received in full, so this only
	// adds redundancy. Default DefaultResend.
	Resend int
	// Copies is how many times each datagram of a round is sent to each
	// peer: all of the round's datagrams once, then all of them again,
	// and so on. Counters are cumulative, so a duplicate costs bytes, not
	// accuracy; a round then reaches a peer unless every copy is lost,
	// which makes convergence after a loss and the spend cap's view of
	// the other nodes much less sensitive to packet loss. Traffic grows
	// in proportion. 1 sends each datagram once. Default DefaultCopies,
	// at most MaxCopies.
	Copies int
	// MaxRoundBytes bounds the report entries (keys and counters) one
	// round sends each peer, before copies. Counters that do not fit go
	// in later rounds, those pending longest first, and a peer's
	// acknowledgement of a cut round covers only what it carried: nothing
	// is lost, it arrives later. The bound adapts to each peer, like TCP's
	// congestion window: halved (down to one datagram) while a peer
	// acknowledges no round, raised by 8 datagrams a round, up to
	// MaxRoundBytes, while it does; so a round too large for a peer's receive buffer, which would
	// otherwise be lost again every round, shrinks until it gets through.
	// It also keeps a flood of new keys from overrunning the peers.
	// Default DefaultMaxRoundBytes, at least MaxPacket, at most
	// MaxMaxRoundBytes.
	MaxRoundBytes int
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
	Stale           uint64 // datagrams from an earlier incarnation of a peer, addressed to another incarnation of this node, or older than the replay window
	UnknownTable    uint64 // reports for a limiter this node does not have
	HitsApplied     uint64 // units debited because peers reported them
	Duplicate       uint64 // datagrams dropped: sequence number already seen (copies, network duplicates, replays)
	WrongSource     uint64 // authentic datagrams dropped: not from the member's configured address
	Capped          uint64 // reported units not debited, and units of state levels not taken: more than the senders could have admitted, or (keys a full table has no room for) than the overflow bucket's floor
	Overflow        uint64 // decisions and peers' reports of keys MaxKeys left no room for (decided and charged under OverflowKey)
	Resent          uint64 // counters sent again because a peer had not acknowledged them
	// Behind counts rounds whose reports left changed counters for later
	// rounds: more counters changed than a round carries to a peer
	// (Config.MaxRoundBytes, or less while the peer acknowledges little).
	// Each round behind delays the charges of the counters left out by a
	// round: see "Rounds that cannot carry every change" in the package
	// documentation.
	Behind uint64
}

type stats struct {
	rounds, sent, bytes, sendErr, recv, malformed, badMAC, unknown, stale, unknownTable, applied, overflow, resent atomic.Uint64
	dup, wrongSource, capped, behind                                                                               atomic.Uint64
	closing                                                                                                        atomic.Uint64 // datagrams that arrived while closing (not in Stats)
}

// Node is one member of a gossip cluster. It owns a Transport and any
// number of Limiters (one per limit, each with its own name), and runs the
// gossip rounds. All methods are safe for concurrent use. The zero value
// is not usable: create nodes with NewNode.
type Node struct {
	tickMu      sync.Mutex // one round at a time: Tick runs from the loop and from callers
	cfg         Config
	settings    limiterkit.Settings
	clk         clock.Source
	id          string
	incarnation atomic.Uint64 // only grows: see NewNode and handle
	interval    int64
	created     int64

	members atomic.Pointer[[]string]         // sorted IDs of self and the live peers: the spend-cap shares
	size    atomic.Int64                     // self and every peer, live or not
	live    atomic.Pointer[map[string]*peer] // the live peers of members, by ID (read only their done)
	tick    atomic.Int64                     // round of the last Tick: marks when counters change
	gated   atomic.Bool                      // deciding conservatively: see Node.gate

	mu       sync.Mutex // guards the fields below
	peers    map[string]*peer
	limiters map[string]*Limiter
	owned    map[string]*OwnedLimiter // by name: see NewOwnedLimiter
	round    int64
	sendSig  *signer
	closed   bool
	stop     chan struct{}
	started  bool
	ms       Membership
	unsub    func() // stops the membership's events

	gateDone  bool // the gate was lifted, for good (see Node.gate)
	startGate bool // gated is the start gate's: see Node.gateStart

	rmu     sync.Mutex // guards recvSig
	recvSig *signer

	wg sync.WaitGroup
	st stats

	own ownership // who owns the keys of owned limiters: see publishOwners
}

// sentRound is what one round's reports carried to a peer: every counter
// from position from (inclusive) to position to (exclusive; the round
// itself, pos{ch: r}, unless MaxRoundBytes cut it).
type sentRound struct {
	from, to pos
	parts    []pos // where each report datagram of the round starts
}

// replayWindow is how many sequence numbers below the highest one seen a
// node still accepts from a peer (datagrams reordered within a round).
const replayWindow = 64 * 64

type peer struct {
	addr        string
	acceptFrom  int64  // counters born before this (ns) are baselined, not debited
	incarnation uint64 // the peer's, 0 until heard; only grows
	seq         uint64 // last sequence number sent to the peer
	rxSeq       uint64 // highest sequence number received from the peer's incarnation
	rxWin       [replayWindow / 64]uint64
	wrongSrc    uint64   // datagrams from a wrong address, for the log
	added       int64    // ns: when it became a peer
	lastHeard   int64    // ns; 0 before the first datagram
	dead        bool     // unheard for deadAfter: out of the spend-cap shares until it speaks
	down        bool     // declared dead by the membership: out of the shares until it joins again
	floor       uint64   // the incarnation the membership reported: older ones are stale
	needState   bool     // start a catch-up next round (peer is new or restarted)
	catchUp     *catchUp // the bucket levels the peer is being sent, nil if none
	acked       uint64   // the peer has every counter changed before this round...
	ackedPos    pos      // ...and those up to this position (ch == acked) of the round acked
	sent        map[uint64]sentRound
	budget      int    // report bytes per round for this peer: halved when rounds go unacknowledged
	ackSeen     uint64 // the highest of our rounds the peer said it got in full
	cutAt       int64  // round of the last halving of budget

	// The peer's datagrams of its latest round, to acknowledge it.
	rxRound    uint64
	rxParts    uint16
	rxCount    uint16
	rxGot      []uint64      // bitset of parts received
	rxPrefix   uint16        // parts received from part 0 without a gap
	rxComplete uint64        // latest round of the peer received in full
	rx         rxCatchUp     // what the peer's rounds say of this node's catch-up
	start      int64         // when the peer's current life started (ns); 0 before heard
	done       atomic.Uint64 // rxComplete, for the spend cap's lock-free readers (see Limiter.shares)
}

// NewNode validates cfg and returns a node that listens on cfg.Transport
// at once. It gossips when Tick is called; Start calls Tick on a timer.
// opts set the clock and the bounds on keys for every limiter of the node;
// throttle.WithSweepInterval has no effect, as Tick drops idle keys (see
// Memory and the key cap). Errors wrap throttle.ErrInvalid.
func NewNode(cfg Config, opts ...throttle.Option) (*Node, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, settings: s, clk: clock.New(s.Clock), interval: int64(cfg.Interval),
		peers: map[string]*peer{}, limiters: map[string]*Limiter{}, owned: map[string]*OwnedLimiter{},
		sendSig: newSigner(cfg.Secret), recvSig: newSigner(cfg.Secret),
	}
	n.created = n.clk.Now()
	n.tick.Store(n.created / n.interval)
	ms := cfg.Membership
	if ms == nil {
		ms = NewStaticMembership(Member{}, cfg.Peers...)
	}
	if err := n.identify(ms.Local()); err != nil {
		return nil, err
	}
	if err := n.join(ms); err != nil {
		return nil, err
	}
	n.gateStart()
	if cfg.Transport != nil {
		if err := cfg.Transport.Listen(n.handle); err != nil {
			n.unsub()
			return nil, err
		}
	}
	return n, nil
}

// setDefaults sets the zero fields of cfg that have a default.
func (cfg *Config) setDefaults() {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Resend == 0 {
		cfg.Resend = DefaultResend
	}
	if cfg.Copies == 0 {
		cfg.Copies = DefaultCopies
	}
	if cfg.MaxRoundBytes == 0 {
		cfg.MaxRoundBytes = DefaultMaxRoundBytes
	}
}

// check returns an error wrapping throttle.ErrInvalid if cfg, its
// defaults set, is not valid.
func (cfg *Config) check() error {
	switch {
	case cfg.Interval < MinInterval:
		return fmt.Errorf("%w: gossip interval %v is below %v", throttle.ErrInvalid, cfg.Interval, MinInterval)
	case cfg.Resend < 1 || cfg.Resend > 1000:
		return fmt.Errorf("%w: Resend %d out of [1, 1000]", throttle.ErrInvalid, cfg.Resend)
	case cfg.MaxRoundBytes < MaxPacket || cfg.MaxRoundBytes > MaxMaxRoundBytes:
		return fmt.Errorf("%w: MaxRoundBytes %d out of [%d, %d]", throttle.ErrInvalid, cfg.MaxRoundBytes, MaxPacket, MaxMaxRoundBytes)
	case cfg.Copies < 1 || cfg.Copies > MaxCopies:
		return fmt.Errorf("%w: Copies %d out of [1, %d]", throttle.ErrInvalid, cfg.Copies, MaxCopies)
	case cfg.Transport == nil && len(cfg.Peers) > 0:
		return fmt.Errorf("%w: peers need a Transport", throttle.ErrInvalid)
	case cfg.Membership != nil && len(cfg.Peers) > 0:
		return fmt.Errorf("%w: Peers and a Membership: list the peers in the Membership", throttle.ErrInvalid)
	case cfg.Transport != nil && len(cfg.Secret) < MinSecretLen && (len(cfg.Secret) > 0 || !authenticated(cfg.Transport)):
		return fmt.Errorf("%w: gossip secret must be at least %d bytes", throttle.ErrInvalid, MinSecretLen)
	}
	return nil
}

// identify sets the node's ID and incarnation: the membership's local
// member's, else Config.ID and the start time.
func (n *Node) identify(local Member) error {
	n.id = cmp.Or(local.ID, n.cfg.ID)
	if n.id == "" && n.cfg.Transport != nil {
		n.id = n.cfg.Transport.Addr()
	}
	if n.id == "" {
		n.id = "standalone"
	}
	switch {
	case local.ID != "" && n.cfg.ID != "" && local.ID != n.cfg.ID:
		return fmt.Errorf("%w: Config.ID %q differs from the membership's %q", throttle.ErrInvalid, n.cfg.ID, local.ID)
	case len(n.id) > maxName:
		return fmt.Errorf("%w: node ID longer than %d bytes", throttle.ErrInvalid, maxName)
	}
	// The incarnation is the membership's, else the start time, so that
	// a node's lives are ordered: a peer adopts only a newer incarnation
	// than the one it knows, and refuses whatever names an older one. A
	// node restarted after its clock was set back starts below its
	// previous life; the first peer that still knows that life names it
	// in its datagrams, and the node moves past it (see handle).
	n.incarnation.Store(cmp.Or(local.Incarnation, uint64(max(n.created, 1))))
	return nil
}

// join subscribes the node to ms's events and adds its members as peers.
func (n *Node) join(ms Membership) error {
	// Events may arrive from here on, concurrently with Members.
	n.ms, n.unsub = ms, ms.Subscribe(n.memberEvent)
	members := ms.Members() // not under n.mu: the membership may hold its lock while it calls memberEvent
	n.mu.Lock()
	for _, m := range members {
		if err := n.addPeer(m.ID); err != nil {
			n.mu.Unlock()
			n.unsub() // not under n.mu either
			return err
		}
		if p := n.peers[m.ID]; p != nil {
			p.floor = max(p.floor, m.Incarnation)
		}
	}
	n.publishMembers()
	n.mu.Unlock()
	return nil
}

// memberEvent applies one change of the membership.
func (n *Node) memberEvent(e MemberEvent) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.cfg.Transport == nil {
		return
	}
	id := e.Member.ID
	switch e.Kind {
	case MemberJoin:
		if n.addPeer(id) != nil {
			return
		}
		if p := n.peers[id]; p != nil {
			p.down, p.floor = false, max(p.floor, e.Member.Incarnation)
		}
	case MemberDead:
		if p := n.peers[id]; p != nil {
			p.down = true
		}
	case MemberLeave:
		delete(n.peers, id)
	}
	n.publishMembers()
	if e.Kind != MemberJoin {
		n.liftStart(n.clk.Now()) // a silent member it waited for is gone
	}
}

// authenticated reports whether tr authenticates the datagrams it
// delivers (see Config.Secret).
func authenticated(tr Transport) bool {
	a, ok := tr.(interface{ Authenticated() bool })
	return ok && a.Authenticated()
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
	now := n.clk.Now()
	n.peers[addr] = &peer{addr: addr, added: now, acceptFrom: now - n.interval}
	if n.cfg.Transport != nil {
		n.engageStart()
	}
	return nil
}

// publishMembers publishes the members that share the tokens: this node
// and its live peers. Called with n.mu held.
func (n *Node) publishMembers() {
	m := []string{n.id}
	live := map[string]*peer{}
	for a, p := range n.peers {
		if !p.dead && !p.down {
			m = append(m, a)
			live[a] = p
		}
	}
	slices.Sort(m)
	n.live.Store(&live)
	n.members.Store(&m)
	n.size.Store(int64(len(n.peers) + 1))
	n.publishOwners(len(m))
	// Shares change with the members: clear what denials published with
	// the old ones. A denial that computed with them and publishes after
	// this sees the new list and clears its own. Without the spend cap
	// nothing publishes it: no scan of every key at each change (a peer
	// going quiet for a few rounds and back, under the node's mutex).
	if !n.cfg.SpendCap {
		return
	}
	for _, l := range n.limiters {
		l.table.each(func(_ string, e *entry) { e.full.Store(0) })
	}
}

// Join adds a peer at run time. Once the peer speaks, the node sends it
// every live counter and, over the following rounds, its bucket levels
// (see Tick), and counts the peer's hits from now on. Errors wrap throttle.ErrInvalid or throttle.ErrClosed.
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
		Resent: n.st.resent.Load(), Duplicate: n.st.dup.Load(), WrongSource: n.st.wrongSource.Load(), Capped: n.st.capped.Load(),
		Behind: n.st.behind.Load(),
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
	owned := slices.Collect(maps.Values(n.owned))
	n.mu.Unlock()
	n.unsub()
	n.wg.Wait()
	for _, l := range owned {
		l.Close()
	}
	var err error
	if n.cfg.Transport != nil {
		err = n.cfg.Transport.Close()
	}
	for _, l := range lims {
		err = errors.Join(err, l.Close())
	}
	return err
}

// unheard reports whether the peer counts as dead at now: unheard for
// longer than deadAfter (ns), and not heard since last, the start of the
// round this node ran before (a node whose own rounds run late does not
// take its peers for dead because it was not there to hear them).
// Called with Node.mu held.
func (p *peer) unheard(now, deadAfter, last int64) bool {
	heard := max(p.lastHeard, p.added)
	return now-heard > deadAfter && heard < last
}

// deadAfter is how long (ns) a peer may go unheard before it counts as
// dead: out of the spend-cap shares, sent hellos only, until it speaks.
func (n *Node) deadAfter() int64 { return int64(n.cfg.Resend+3) * n.interval }

// Tick runs one gossip round if a round boundary has passed since the
// last one, and reports whether it did. A round sends every peer that is
// alive the counters that changed since the latest round it acknowledged
// (at least those of the last Resend rounds), the next part of its
// bucket levels to a peer that is new or restarted (half of the peer's
// budget, resumed after what it acknowledged, until it has them all), and
// a hello to the others; then it drops idle state. Rounds run one at a
// time: a Tick waits for one under way (Start's loop, or another caller).
func (n *Node) Tick() bool {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	rd := n.beginRound(n.clk.Now())
	if rd == nil {
		return false
	}
	for _, l := range rd.lims {
		l.rotate(rd.r, rd.prev)
	}
	n.st.rounds.Add(1)
	order := slices.SortedFunc(maps.Keys(rd.groups), func(a, b group) int {
		return cmp.Or(a.from.cmp(b.from), cmp.Compare(a.budget, b.budget))
	})
	behind := false
	for _, g := range order {
		behind = n.sendReports(rd, g, rd.groups[g]) || behind
	}
	if behind {
		n.st.behind.Add(1)
	}
	if len(rd.silent) > 0 {
		// What changed since the last round run, however late it ran.
		rep := n.reports(rd.lims, rd.r, rd.prev, pos{ch: min(rd.r-int64(n.cfg.Resend), rd.prev)}, n.cfg.MaxRoundBytes, true)
		for _, d := range rd.silent {
			n.send(d.addr, d.ack, rep.bodies, rd.r)
		}
	}
	for _, l := range rd.lims {
		l.expire(rd.r, rd.minAck)
	}
	return true
}

// round is what a round sends, planned at its start under the node's
// mutex.
type round struct {
	r, prev int64      // the round, and the one run before it
	lims    []*Limiter // sorted by name
	groups  map[group][]dest
	silent  []dest // peers sent only what changed lately
	minAck  int64  // the oldest round a live peer has not acknowledged
}

// dest is a peer a round sends to.
type dest struct {
	addr string
	ack  uint64
	cu   *catchUp // bucket levels to send the peer, if not nil
	inc  uint64
}

// group is the peers sent the same reports: from the same position, with
// the same budget.
type group struct {
	from   pos
	budget int
}

// beginRound starts the round of now, if a round boundary has passed
// since the last one (else it returns nil), and plans what it sends each
// peer.
func (n *Node) beginRound(now int64) *round {
	r := now / n.interval
	n.mu.Lock()
	if n.closed || r <= n.round {
		n.mu.Unlock()
		return nil
	}
	rd := &round{r: r, prev: n.round, groups: map[group][]dest{}, minAck: r}
	n.round = r
	n.tick.Store(r)
	if inc := n.ms.Local().Incarnation; inc > n.incarnation.Load() {
		// The membership moved this node's life past an older one.
		n.incarnation.Store(inc)
	}
	// Sorted iteration keeps simulations on the in-memory network
	// reproducible.
	changed := false
	for _, addr := range slices.Sorted(maps.Keys(n.peers)) {
		changed = n.plan(rd, n.peers[addr], now) || changed
	}
	if changed {
		n.publishMembers()
	}
	n.gate(now)
	for _, l := range n.limiters {
		rd.lims = append(rd.lims, l)
	}
	n.mu.Unlock()
	slices.SortFunc(rd.lims, func(a, b *Limiter) int { return strings.Compare(a.name, b.name) })
	return rd
}

// plan adds what round rd sends peer p to rd, and reports whether p
// went dead or came back. Called with n.mu held.
func (n *Node) plan(rd *round, p *peer, now int64) (changed bool) {
	d := dest{addr: p.addr, ack: p.rxComplete, inc: p.incarnation}
	if dead := p.unheard(now, n.deadAfter(), rd.prev*n.interval); dead != p.dead {
		p.dead, changed = dead, true
	}
	if p.dead || p.down {
		// Not heard from (yet, or lately), or declared dead: hello only, until it
		// speaks; then it gets all it has not acknowledged. Its
		// share of the tokens goes to the live members.
		rd.silent = append(rd.silent, d)
		return changed
	}
	d.cu = p.catchingUp()
	since := min(rd.r-int64(n.cfg.Resend), int64(p.acked))
	rd.minAck = min(rd.minAck, int64(p.acked))
	p.adapt(rd.r, n.cfg.MaxRoundBytes)
	from := pos{ch: since}
	if since == int64(p.acked) {
		from = p.ackedPos
	}
	g := group{from, p.budget}
	if d.cu != nil {
		g.budget = max(p.budget/2, MaxPacket) // the other half for the levels
	}
	rd.groups[g] = append(rd.groups[g], d)
	return changed
}

// adapt sets the peer's report budget for round r, like TCP's congestion
// window: most at first, raised while the peer acknowledges rounds,
// halved once per round trip while it does not. Called with n.mu held.
func (p *peer) adapt(r int64, most int) {
	switch {
	case p.budget == 0:
		p.budget = most
	case int64(p.ackSeen) >= r-2:
		p.budget = min(p.budget+8*MaxPacket, most)
	case len(p.sent) > 0 && r-p.cutAt >= 2:
		// Halve once per round trip: the rounds sent since the last
		// cut are not answered yet.
		p.budget = max(p.budget/2, MaxPacket)
		p.cutAt = r
	}
}

// sendReports sends the peers ds of group g their reports of round rd,
// and the bucket levels of those catching up, and records what it sent.
// It reports whether the reports left changed counters for later rounds.
func (n *Node) sendReports(rd *round, g group, ds []dest) (behind bool) {
	rep := n.reports(rd.lims, rd.r, rd.prev, g.from, g.budget, false)
	n.st.resent.Add(uint64(rep.resent * len(ds)))
	n.mu.Lock()
	for _, d := range ds {
		if p := n.peers[d.addr]; p != nil {
			if p.sent == nil || len(p.sent) > 1024 {
				p.sent = map[uint64]sentRound{}
			}
			p.sent[uint64(rd.r)] = sentRound{from: g.from, to: rep.to, parts: rep.parts}
		}
	}
	n.mu.Unlock()
	for _, d := range ds {
		b := rep.bodies
		if d.cu != nil {
			b = append(b[:len(b):len(b)], n.catchUpBodies(d.cu, rd.lims, rd.r, g.budget, len(b), d.addr, d.inc)...)
		}
		n.send(d.addr, d.ack, b, rd.r)
	}
	return rep.to.cmp(pos{ch: rd.r}) < 0
}

// send seals bodies for one peer (a hello if there are none) and sends
// them.
func (n *Node) send(addr string, ack uint64, bodies [][]byte, r int64) {
	if n.cfg.Transport == nil {
		return
	}
	if len(bodies) == 0 {
		bodies = n.encode(msgHello, "", r, func(*encoder) {})
	}
	if len(bodies) > math.MaxUint16 {
		// Not within MaxMaxRoundBytes: a round cut here would be
		// acknowledged as if whole.
		bodies = bodies[:math.MaxUint16]
	}
	n.mu.Lock()
	pr := n.peers[addr]
	if pr == nil {
		n.mu.Unlock()
		return // left meanwhile
	}
	sealed := make([][]byte, len(bodies))
	for i, b := range bodies {
		pr.seq++
		sealed[i] = n.sendSig.seal(b, addr, header{ack: ack, part: uint16(i), parts: uint16(len(bodies)), seq: pr.seq,
			dstInc: pr.incarnation, pround: pr.rxRound, prefix: pr.rxPrefix})
	}
	n.mu.Unlock()
	// Copies go out after the whole round rather than back to back, so
	// that a short burst of loss does not take every copy of a datagram.
	for range n.cfg.Copies {
		for _, p := range sealed {
			if err := n.cfg.Transport.Send(addr, p); err != nil {
				n.st.sendErr.Add(1)
				continue
			}
			n.st.sent.Add(1)
			n.st.bytes.Add(uint64(len(p)))
		}
	}
}

// encode returns the unsealed bodies of one message type.
func (n *Node) encode(typ byte, table string, r int64, fill func(*encoder)) [][]byte {
	if n.cfg.Transport == nil {
		return nil
	}
	e := &encoder{hdr: header{typ: typ, sender: n.id, table: table, incarnation: n.incarnation.Load(), round: uint64(r), start: n.created}}
	fill(e)
	return e.finish()
}

// handle receives one datagram from the transport, sent from address
// from ("" if the transport does not know): it authenticates it, admits
// it from a peer, and applies what it carries.
func (n *Node) handle(p []byte, from string) {
	m, drop := n.open(p)
	if drop == nil {
		var l *Limiter
		var acceptFrom int64
		if l, acceptFrom, drop = n.admit(m, from); drop == nil {
			n.st.recv.Add(1)
			drop = n.apply(m, l, acceptFrom)
		}
	}
	if drop != nil {
		drop.Add(1)
	}
}

// open authenticates and parses a datagram. If it is refused, it returns
// the counter of the reason.
func (n *Node) open(p []byte) (*message, *atomic.Uint64) {
	n.rmu.Lock()
	m, err := decode(n.recvSig, p, MaxKeyLen, n.id)
	n.rmu.Unlock()
	switch {
	case errors.Is(err, errMAC):
		return nil, &n.st.badMAC
	case err != nil:
		return nil, &n.st.malformed
	}
	return m, nil
}

// admit takes an authentic datagram as news from a peer: from a member,
// at its address, of its current life, addressed to this node's, and not
// seen before. It records what the datagram acknowledges and completes,
// and returns the limiter it is for (nil for a hello) and the time from
// which the sender's counters are debited; or, if the datagram is
// refused, the counter of the reason.
func (n *Node) admit(m *message, from string) (l *Limiter, acceptFrom int64, drop *atomic.Uint64) {
	now := n.clk.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, 0, &n.st.closing
	}
	pr := n.peers[m.sender]
	switch {
	case pr == nil:
		return nil, 0, &n.st.unknown
	case from != "" && !n.matchAddr(pr.addr, from):
		pr.wrongSrc++
		return nil, 0, &n.st.wrongSource
	}
	n.noteStart(pr, m)
	switch {
	case !n.current(pr, m):
		return nil, 0, &n.st.stale
	}
	if m.incarnation > pr.incarnation {
		pr.adopt(m, n.created+n.interval)
	}
	if fresh, old := pr.accept(m.seq); !fresh {
		if old {
			return nil, 0, &n.st.stale
		}
		return nil, 0, &n.st.dup
	}
	if !ownedMsg(m.typ) { // asks and answers are outside the rounds
		pr.acknowledged(m)
		pr.rx.note(m, pr.rxRound, pr.rxCount == pr.rxParts, n.incarnation.Load())
		pr.received(m)
	}
	pr.lastHeard = now
	n.own.heard(m.start, n.created-n.interval)
	if pr.dead {
		pr.dead = false // back in the shares
		n.publishMembers()
	}
	if m.typ != msgHello {
		l = n.limiters[m.table]
	}
	return l, pr.acceptFrom, nil
}

// current reports whether m belongs to the current lives of its sender pr
// and of this node: not older than either. Called with n.mu held.
func (n *Node) current(pr *peer, m *message) bool {
	self := n.incarnation.Load()
	switch {
	case m.incarnation < max(pr.incarnation, pr.floor):
		// From an earlier life of the peer: replayed, or late.
		return false
	case m.dstInc > self:
		// The peer knows a later life of this node than this one: its
		// clock was set back across a restart. Move past it, so that
		// the peers adopt this life; the datagram, addressed to the
		// other life, is dropped (what it carries is sent again).
		n.incarnation.Store(m.dstInc + 1)
		return false
	case m.dstInc != self && (m.dstInc != 0 || m.typ == msgState || ownedMsg(m.typ)):
		// Addressed to an earlier life of this node: replayed, or late.
		// Reports and hellos sent before the sender knew this node's
		// incarnation (0) are accepted: the counters of reports born
		// before this node listened to the sender are baselines, not
		// debits, so replaying old ones charges nothing.
		return false
	}
	return true
}

// adopt takes m's incarnation as the peer's, newer than the one known:
// a new peer, or one that restarted. It forgets what the peer
// acknowledged. If the peer restarted, or started after late (ns, this
// node's start plus an interval), it missed history that its fresh
// buckets lack: it is sent bucket levels. (Nodes of a cluster started
// together do not exchange levels, which would count hits twice.)
// Called with n.mu held.
func (p *peer) adopt(m *message, late int64) {
	if p.incarnation != 0 || m.start > late {
		p.needState = true
	}
	p.incarnation = m.incarnation
	p.acked, p.ackedPos, p.rxRound, p.rxComplete, p.sent = 0, pos{}, 0, 0, nil
	p.done.Store(0)
	p.rxSeq, p.rxWin = 0, [replayWindow / 64]uint64{}
	p.ackSeen, p.budget = 0, 0
}

// acknowledged records what of our rounds m says the peer received. An
// acknowledged round brings the peer up to date only if it carried
// everything since what the peer had already acknowledged (a round with
// only a hello does not). Called with n.mu held.
func (p *peer) acknowledged(m *message) {
	p.ackSeen = max(p.ackSeen, m.ack)
	cur := p.ackedPos
	cur.ch = int64(p.acked)
	if sr, ok := p.sent[m.pround]; ok && m.prefix > 0 && int(m.prefix) < len(sr.parts) && sr.from.cmp(cur) <= 0 && sr.parts[m.prefix].cmp(cur) > 0 {
		// The leading datagrams of a round arrived: the counters before
		// the first missing one are delivered.
		p.acked, p.ackedPos = uint64(sr.parts[m.prefix].ch), sr.parts[m.prefix]
		cur = sr.parts[m.prefix]
	}
	if sr, ok := p.sent[m.ack]; ok && sr.from.cmp(cur) <= 0 && sr.to.cmp(cur) > 0 {
		p.acked, p.ackedPos = uint64(sr.to.ch), sr.to
		for r := range p.sent {
			if r <= m.ack {
				delete(p.sent, r)
			}
		}
	}
	p.ackCatchUp(m)
}

// received records that m, one datagram of the peer's round, arrived,
// to acknowledge the round. Called with n.mu held.
func (p *peer) received(m *message) {
	if m.round > p.rxRound {
		p.rxRound, p.rxParts, p.rxCount, p.rxPrefix = m.round, m.parts, 0, 0
		p.rxGot = make([]uint64, (int(m.parts)+63)/64)
	}
	if m.round != p.rxRound || m.parts != p.rxParts || p.rxGot[m.part/64]&(1<<(m.part%64)) != 0 {
		return
	}
	p.rxGot[m.part/64] |= 1 << (m.part % 64)
	if p.rxCount++; p.rxCount == p.rxParts {
		p.rxComplete = max(p.rxComplete, p.rxRound)
		p.done.Store(p.rxComplete)
	}
	for p.rxPrefix < p.rxParts && p.rxGot[p.rxPrefix/64]&(1<<(p.rxPrefix%64)) != 0 {
		p.rxPrefix++
	}
}

// apply debits what an admitted report or state carries from l. It
// returns the counter of why it could not (a limiter this node lacks).
func (n *Node) apply(m *message, l *Limiter, acceptFrom int64) *atomic.Uint64 {
	switch {
	case m.typ == msgHello:
	case ownedMsg(m.typ):
		return n.applyOwned(m)
	case l == nil:
		return &n.st.unknownTable
	case m.typ == msgReport:
		applied, capped := l.applyReport(m, acceptFrom, n.tick.Load())
		n.st.applied.Add(uint64(applied))
		addSat(&n.st.capped, capped)
	case m.typ == msgState:
		addSat(&n.st.capped, l.applyState(m, n.tick.Load()))
	}
	return nil
}

// addSat adds v >= 0 to c, saturating at math.MaxUint64.
func addSat(c *atomic.Uint64, v int64) {
	for {
		old := c.Load()
		if c.CompareAndSwap(old, old+min(uint64(v), math.MaxUint64-old)) {
			return
		}
	}
}

// accept records sequence number seq of the peer's current incarnation
// and reports whether it is new; if not, old says it fell out of the
// window rather than being a repeat. Called with n.mu held.
func (p *peer) accept(seq uint64) (fresh, old bool) {
	const w = uint64(replayWindow)
	switch {
	case seq > p.rxSeq:
		if shift := seq - p.rxSeq; shift >= w {
			p.rxWin = [replayWindow / 64]uint64{}
		} else {
			for i := p.rxSeq + 1; i <= seq; i++ {
				p.rxWin[(i%w)/64] &^= 1 << (i % 64)
			}
		}
		p.rxSeq = seq
	case p.rxSeq-seq >= w:
		return false, true
	case p.rxWin[(seq%w)/64]&(1<<(seq%64)) != 0:
		return false, false
	}
	p.rxWin[(seq%w)/64] |= 1 << (seq % 64)
	return true, false
}

// matchAddr reports whether a datagram from address from may come from
// the member known as peer.
func (n *Node) matchAddr(peer, from string) bool {
	if peer == from {
		return true
	}
	if m, ok := n.cfg.Transport.(interface{ matchAddr(peer, from string) bool }); ok {
		return m.matchAddr(peer, from)
	}
	return false
}
