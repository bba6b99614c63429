package gossip

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

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
	UnknownTable    uint64 // reports, states, asks and answers for a limiter this node did not have when they arrived (reports and states are kept, bounded, and applied when it is created: see Node.NewLimiter)
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
	leftSeq  uint64 // the highest sequence number sent to a peer that left: see removePeer
	limiters map[string]*Limiter
	early    map[string]*earlyTable   // messages for limiters not created yet: see keepEarly
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

// ID returns the node's ID: Config.ID, or its transport address.
func (n *Node) ID() string { return n.id }

// Interval returns the gossip period.
func (n *Node) Interval() time.Duration { return time.Duration(n.interval) }

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
