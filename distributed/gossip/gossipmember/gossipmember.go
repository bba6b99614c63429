// Package gossipmember runs a gossip.Node's membership on
// hashicorp/memberlist: nodes join through seeds (addresses or DNS names)
// and a discovery function, rejoin them on a loop, and SWIM failure
// detection takes a dead node out of the spend-cap shares at once. The
// counters still travel over the node's own UDP transport, sealed under
// the same keyring as memberlist's traffic (gossip.Seal), so keys rotate
// without a restart.
//
//	ring, _ := memberlist.NewKeyring(nil, key)
//	m, err := gossipmember.New(gossipmember.Config{Bind: "10.0.0.5:7947", GossipAddr: "10.0.0.5:7946",
//		Seeds: []string{"throttled.internal:7947"}, Keyring: ring})
//	udp, err := gossip.ListenUDP("10.0.0.5:7946")
//	tr, err := gossip.Seal(udp, ring)
//	node, err := gossip.NewNode(gossip.Config{Transport: tr, Membership: m})
//	defer m.Close() // after node.Close
//
// Each node publishes in its memberlist metadata its gossip address (the
// node's ID) and its incarnation: its start time, or above the
// incarnation the cluster still gossips for its name if that is higher
// (a clock set back across a restart), learned when it joins. memberlist's
// own incarnation number is not exported, and restarts at zero with each
// life, so it cannot serve.
package gossipmember

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/internal/subscribers"
)

// Defaults of Config.
const (
	defaultRejoin     = 10 * time.Second
	defaultForgetDead = time.Hour
)

// Config configures a Membership. Bind and GossipAddr are required.
type Config struct {
	// Name is the node's unique name in memberlist. Default GossipAddr.
	Name string
	// Bind is memberlist's address (TCP and UDP), e.g. "10.0.0.5:7947";
	// port 0 picks a free one. It must differ from the gossip port.
	Bind string
	// Advertise is the address the other members reach memberlist at,
	// when Bind is a wildcard. Default Bind.
	Advertise string
	// GossipAddr is the gossip node's ID: the address its counters are
	// sent to (gossip.Config.ID).
	GossipAddr string
	// Seeds are memberlist addresses of members to join through,
	// host:port; a DNS name stands for every address it resolves to.
	Seeds []string
	// Discover, if set, returns more seeds at each join attempt: a DNS
	// query of the program's own, a reloaded list.
	Discover func(context.Context) ([]string, error)
	// Rejoin is how often the seeds no member answers at are joined
	// again, which heals a partition after the sides forgot each other
	// and takes in nodes discovery reports. Default 10 s.
	Rejoin time.Duration
	// ForgetDead is how long a node dead or gone stays a peer (out of
	// the shares, its late reports still charged) before it is forgotten.
	// Default 1 h.
	ForgetDead time.Duration
	// Keyring encrypts memberlist's traffic; give the same to gossip.Seal
	// for the counters. Nil: memberlist's traffic is in clear.
	Keyring *memberlist.Keyring
	// Memberlist is the configuration to start from (timings, transport);
	// default memberlist.DefaultLANConfig(). Its name, addresses,
	// delegates and keyring are set from this Config.
	Memberlist *memberlist.Config
	// Logger receives memberlist's log. Default: discarded.
	Logger *slog.Logger
	// Now is the clock the incarnation is read from. Default time.Now.
	Now func() time.Time
}

// Membership is a gossip.Membership on memberlist. It is safe for
// concurrent use; create it with New and stop it with Close.
type Membership struct {
	cfg Config
	ml  *memberlist.Memberlist
	inc atomic.Uint64 // this life's incarnation: its start time, or past an older life's (see delegate.NotifyMerge)

	self string // memberlist address of this node

	subs subscribers.List[gossip.MemberEvent]

	mu    sync.Mutex             // guards the fields below and orders the events
	alive map[string]peer        // by memberlist name, from its events (its nodes may not be read outside them)
	dead  map[string]*time.Timer // by memberlist name: forgotten when they fire

	stop  chan struct{}
	moved chan struct{} // the incarnation moved: publish it
	wg    sync.WaitGroup
	once  sync.Once
}

// ErrJoin is returned by Membership.Join when no seed could be joined.
var ErrJoin = errors.New("gossipmember: no seed could be joined")

// New starts memberlist, joins the seeds once (a failure is not fatal:
// the rejoin loop tries again) and starts the rejoin loop. Errors wrap
// throttle.ErrInvalid for a bad Config.
func New(cfg Config) (*Membership, error) {
	if cfg.Bind == "" || cfg.GossipAddr == "" {
		return nil, fmt.Errorf("%w: gossipmember: Bind and GossipAddr are required", throttle.ErrInvalid)
	}
	if len(cfg.GossipAddr) > 255 {
		return nil, fmt.Errorf("%w: gossipmember: GossipAddr too long", throttle.ErrInvalid)
	}
	if cfg.Name == "" {
		cfg.Name = cfg.GossipAddr
	}
	if cfg.Rejoin <= 0 {
		cfg.Rejoin = defaultRejoin
	}
	if cfg.ForgetDead <= 0 {
		cfg.ForgetDead = defaultForgetDead
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	mc := memberlist.DefaultLANConfig()
	if cfg.Memberlist != nil {
		c := *cfg.Memberlist
		mc = &c
	}
	host, port, err := splitPort(cfg.Bind)
	if err != nil {
		return nil, err
	}
	mc.Name, mc.BindAddr, mc.BindPort = cfg.Name, host, port
	mc.AdvertiseAddr, mc.AdvertisePort = "", port
	if cfg.Advertise != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitPort(cfg.Advertise); err != nil {
			return nil, err
		}
	}
	mc.Keyring = cfg.Keyring
	mc.Logger = log.New(io.Discard, "", 0)
	if cfg.Logger != nil {
		mc.Logger = log.New(logWriter{cfg.Logger}, "", 0)
	}
	m := &Membership{
		cfg:   cfg,
		alive: map[string]peer{}, dead: map[string]*time.Timer{},
		stop: make(chan struct{}), moved: make(chan struct{}, 1),
	}
	m.inc.Store(uint64(max(cfg.Now().UnixNano(), 1)))
	d := &delegate{m: m}
	mc.Delegate, mc.Events, mc.Merge, mc.Alive = d, d, d, d
	if m.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("gossipmember: %w", err)
	}
	// Read before the first join: until then nothing else writes it.
	m.self = m.ml.LocalNode().Address()
	m.Join(context.Background())
	m.wg.Add(1)
	go m.rejoin()
	return m, nil
}

func splitPort(hostport string) (string, int, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("%w: gossipmember: address %q: %v", throttle.ErrInvalid, hostport, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: gossipmember: port of %q", throttle.ErrInvalid, hostport)
	}
	return host, port, nil
}

// logWriter passes memberlist's log lines to a slog.Logger at the level
// their prefix names ("[ERR] ", "[WARN] ", "[INFO] ", else debug).
type logWriter struct{ l *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	msg, level := strings.TrimSpace(string(p)), slog.LevelDebug
	for prefix, l := range map[string]slog.Level{"[ERR] ": slog.LevelError, "[WARN] ": slog.LevelWarn, "[INFO] ": slog.LevelInfo} {
		if m, ok := strings.CutPrefix(msg, prefix); ok {
			msg, level = m, l
		}
	}
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}

// Local implements gossip.Membership: the gossip address and the
// incarnation of this life, which moves past an older life's if the
// cluster gossips one (see the package doc).
func (m *Membership) Local() gossip.Member {
	return gossip.Member{ID: m.cfg.GossipAddr, Incarnation: m.inc.Load()}
}

// peer is a live member and its memberlist address.
type peer struct {
	gossip.Member
	addr string
}

// Members implements gossip.Membership: the members alive or suspected,
// sorted by ID.
func (m *Membership) Members() []gossip.Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ms []gossip.Member
	for _, p := range m.alive {
		ms = append(ms, p.Member)
	}
	slices.SortFunc(ms, func(a, b gossip.Member) int { return strings.Compare(a.ID, b.ID) })
	return ms
}

// member decodes a memberlist node's metadata, false if it is this node
// or not a gossip node.
func (m *Membership) member(n *memberlist.Node) (gossip.Member, bool) {
	if n.Name == m.cfg.Name || len(n.Meta) < 9 || n.Meta[0] != metaVersion {
		return gossip.Member{}, false
	}
	return gossip.Member{Incarnation: binary.BigEndian.Uint64(n.Meta[1:]), ID: string(n.Meta[9:])}, true
}

const metaVersion = 1

// Subscribe implements gossip.Membership.
func (m *Membership) Subscribe(f func(gossip.MemberEvent)) (stop func()) { return m.subs.Subscribe(f) }

// emit records an event about memberlist node n and passes it to the
// subscribers. memberlist calls it with its lock held: n may be read.
func (m *Membership) emit(kind gossip.MemberEventKind, n *memberlist.Node) {
	mb, ok := m.member(n)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.dead[n.Name]; t != nil {
		t.Stop()
		delete(m.dead, n.Name)
	}
	if kind == gossip.MemberDead {
		delete(m.alive, n.Name)
		m.dead[n.Name] = time.AfterFunc(m.cfg.ForgetDead, func() { m.forget(n.Name, mb) })
	} else {
		m.alive[n.Name] = peer{mb, n.Address()}
	}
	m.subs.Emit(gossip.MemberEvent{Kind: kind, Member: mb})
}

// forget turns a node dead for ForgetDead into one that left.
func (m *Membership) forget(name string, mb gossip.Member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.dead[name]; !ok {
		return // back meanwhile
	}
	delete(m.dead, name)
	m.subs.Emit(gossip.MemberEvent{Kind: gossip.MemberLeave, Member: mb})
}

// Join joins every seed (Config.Seeds and what Discover returns) that no
// known member answers at. It returns ErrJoin if there were seeds to join
// and none could be.
func (m *Membership) Join(ctx context.Context) error {
	seeds := append([]string(nil), m.cfg.Seeds...)
	if m.cfg.Discover != nil {
		more, err := m.cfg.Discover(ctx)
		if err != nil {
			m.logf("discovery failed: %v", err)
		}
		seeds = append(seeds, more...)
	}
	known := map[string]bool{m.self: true}
	m.mu.Lock()
	for _, p := range m.alive {
		known[p.addr] = true
	}
	m.mu.Unlock()
	var todo []string
	for _, s := range seeds {
		if !known[s] {
			todo = append(todo, s)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if n, err := m.ml.Join(todo); n == 0 {
		m.logf("join %v: %v", todo, err)
		return fmt.Errorf("%w: %v", ErrJoin, err)
	}
	return nil
}

func (m *Membership) logf(format string, args ...any) {
	if m.cfg.Logger != nil {
		m.cfg.Logger.Warn(fmt.Sprintf(format, args...))
	}
}

// rejoin joins the seeds again every Rejoin, and publishes the
// incarnation when it moves, until Close.
func (m *Membership) rejoin() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Rejoin)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Join(context.Background())
		case <-m.moved:
			if err := m.ml.UpdateNode(time.Second); err != nil {
				m.logf("publishing the incarnation: %v", err)
			}
		}
	}
}

// Close leaves the cluster (the others see the node leave, not die),
// waiting up to a second, and stops memberlist. Close the gossip node
// first.
func (m *Membership) Close() error { return m.shutdown(true) }

// shutdown stops the membership, leaving the cluster first if leave.
func (m *Membership) shutdown(leave bool) error {
	var err error
	m.once.Do(func() {
		close(m.stop)
		m.wg.Wait()
		if leave {
			err = m.ml.Leave(time.Second)
		}
		err = errors.Join(err, m.ml.Shutdown())
		m.mu.Lock()
		for _, t := range m.dead {
			t.Stop()
		}
		m.mu.Unlock()
	})
	return err
}

// delegate receives memberlist's callbacks.
type delegate struct{ m *Membership }

// NodeMeta publishes the gossip address and incarnation.
func (d *delegate) NodeMeta(limit int) []byte {
	b := []byte{metaVersion}
	b = binary.BigEndian.AppendUint64(b, d.m.inc.Load())
	return append(b, d.m.cfg.GossipAddr...)
}

func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.m.emit(gossip.MemberJoin, n) }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.m.emit(gossip.MemberJoin, n) }

// NotifyLeave reports a node dead, whether it died or left: memberlist's
// event does not tell the two apart. Either way it leaves the shares at
// once, and is forgotten after ForgetDead unless it comes back.
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.m.emit(gossip.MemberDead, n) }

// NotifyMerge and NotifyAlive see what the cluster gossips about every
// node, this one included, on a join or push/pull and in alive messages:
// if it holds an older life of this node with an incarnation at or above
// this one's (a clock set back across a restart), this life moves past
// it, so that the peers do not take it for the older one.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		d.NotifyAlive(n)
	}
	return nil
}

// NotifyAlive: see NotifyMerge. It accepts every message.
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	if n.Name != d.m.cfg.Name || len(n.Meta) < 9 || n.Meta[0] != metaVersion {
		return nil
	}
	old := binary.BigEndian.Uint64(n.Meta[1:])
	for {
		cur := d.m.inc.Load()
		if old <= cur {
			return nil
		}
		if d.m.inc.CompareAndSwap(cur, old+1) {
			select {
			case d.m.moved <- struct{}{}:
			default:
			}
			return nil
		}
	}
}
