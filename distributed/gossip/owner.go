package gossip

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// DefaultForwardTimeout is the default of OwnedConfig.Timeout: far above
// a forwarded decision's round trip on loopback or a LAN (about 0.1 to
// 1 ms, a few ms at the 99th percentile on a loaded host), short enough
// that a dead owner delays its keys' callers little.
const DefaultForwardTimeout = 50 * time.Millisecond

// DefaultForwardDelay is the default of OwnedConfig.Delay: at most 200
// datagrams of asks a second from a node to an owner, so that under load
// a datagram carries tens of asks (a daemon at 1,000,000 keys: about 35),
// for at most 5 ms more on a forwarded decision; a lone ask does not
// wait for it.
const DefaultForwardDelay = 5 * time.Millisecond

// maxInFlight bounds the asks of one owned limiter waiting for answers;
// past it, asks are decided on the fallback buckets at once.
const maxInFlight = 1 << 16

// OwnedConfig tunes an OwnedLimiter. The zero value of each field selects
// its default.
type OwnedConfig struct {
	// Timeout is how long a caller waits for the owner's answer before it
	// decides on the key's fallback bucket. Default DefaultForwardTimeout.
	Timeout time.Duration
	// Delay is the least time between two datagrams of asks to one
	// owner, but for full ones (MaxPacket). Asks leave at once, in one
	// datagram per owner for the asks of one AllowMany, if none left for
	// that owner within the last Delay; else they gather until Delay
	// after the last one left. So a lone ask waits one round trip, and
	// under load the asks of one Delay share a datagram: an owner's
	// datagrams, answers and wake-ups are at most one per Delay from
	// each node however many asks there are. Default DefaultForwardDelay.
	Delay time.Duration
}

// OwnedLimiter is a keyed token bucket limiter whose keys each have one
// owner in the cluster: the member that wins the rendezvous hash of the
// key and the IDs of the owners: the members the node's Membership does
// not declare dead. The node's own silence rule does not move keys, so a
// loss in one direction cannot give a key two owners while the membership
// reports every member alive; with Config.Peers (a StaticMembership, which
// declares no one dead) keys move only when the peers change (Node.Join,
// Node.Leave), and the keys of a dead peer are decided on the fallback
// buckets until it comes back or leaves. The owner decides on its own bucket of the key, exactly; the other nodes
// forward the decisions to it in batches, one datagram per owner, and
// wait for its answer. A key's state lives on its owner only, so memory
// and traffic do not grow with the number of nodes times the number of
// keys, as the all-to-all counters of Limiter do.
//
// Guarantees: while every node sees the same owners and the answers
// arrive within the timeout, the cluster admits exactly what one bucket
// per key admits. An ask whose datagram or answer is lost or late, or
// whose owner is dead or partitioned, is decided after the timeout on the
// asker's fallback bucket of the key: the limit's rate and burst divided
// by N, the number of configured members, live or not (burst at least
// 1). The owner is then quiet: until an answer from it arrives, its asks
// are decided on the fallback buckets at once, and one of them per
// timeout is still sent to it as a probe that no caller waits for. Asks
// that cannot be sent (an owner not heard from yet) fall back at once, and
// so do asks to an owner that has no limiter of this name (a reload that
// changes a limit reaches the nodes one after the other): it answers at
// once that it cannot decide them. A node that hears no majority of the
// configured members (itself included) decides every key on its
// fallback bucket, and its own keys on its own bucket read at the
// fallback rate and burst (what it admits of
// them, before and while apart, stays within one bucket), so at most one
// side of a partition decides at the full rate. Over a time t the
// cluster thus admits for a key at most burst + rate x t on its owner
// plus, on each of the N-1 other nodes, max(1, burst/N) + rate x t/N,
// whatever the partition: two-way, three-way, one node alone. What a
// node admits on a fallback bucket is then charged to the key's owner,
// once the node hears a majority and the owner answers again (a charge
// datagram, sent twice; lost if both copies are), so that, as with
// all-to-all, over a time that includes the payback the cluster admits
// about one bucket per key: at most burst + rate x t plus what is not
// charged yet. An owner that charged an ask whose answer was lost, or
// was charged for a fallback decision on an ask it had also decided, is
// stricter by that ask. A datagram is never applied twice: a duplicated
// or replayed ask or charge is refused by the node's sequence window
// (Stats.Duplicate, Stats.Stale).
//
// When the owners change, the keys of the member that joined or left
// move, and only those. A bucket that a node creates within a refill
// time (burst/rate) of when it may have gained keys (its start, if a peer
// it hears started more than an interval before it, or it has not heard
// every peer yet: a restart, or a join into a running cluster; a member leaving the
// owners; its quorum coming back) starts as if emptied then, not full: a
// restart or a move adds no burst. A node created with no peers and no
// Membership is a cluster of one: its start is not cold. When its majority comes back, it
// empties every bucket it kept (others may have decided its keys
// meanwhile); other buckets it already held are kept. While the nodes' views of the owners differ, a key may have two
// owners: up to one more bucket for that time.
//
// Memory: an owner keeps one bucket per key it owns (the node's
// throttle.WithMaxKeys bounds them; full buckets are swept every half
// refill time, at least every minute); a non-owner keeps only its asks
// in flight (at most 65536 a limiter; past that it decides at once on
// fallback buckets) and the fallback buckets of keys decided while their
// owner did not answer. The owner holds no state per ask: it decides a
// datagram's asks and answers them as it receives it, so a peer flooding
// asks costs it processing, not memory.
//
// Create it with Node.NewOwnedLimiter; the zero value is not usable. It
// is safe for concurrent use.
type OwnedLimiter struct {
	node     *Node
	name     string
	rate     throttle.Rate
	burst    int
	header   int           // sealed size of an ask datagram's header and MAC
	refill   time.Duration // from empty to full
	timeout  time.Duration
	delay    time.Duration
	exact    gcra.Keyed // the buckets of the keys this node owns
	fallback gcra.Keyed // the buckets of keys whose owner did not answer
	closed   atomic.Bool
	st       ownedStats

	pmu      sync.Mutex       // guards the fields below
	owed     map[string]int64 // units admitted on fallback buckets, not yet charged to their owners
	payTimer *time.Timer      // runs payBack while owed is not empty

	mu    sync.Mutex // guards the fields below
	next  uint64     // the last ask id
	calls map[uint64]call
	out   map[string]*outbox // asks not sent yet, by owner
}

// OwnedStats counts what an OwnedLimiter did. Read it with
// OwnedLimiter.Stats.
type OwnedStats struct {
	Local     uint64 // decisions on keys this node owns, asked here
	Served    uint64 // decisions made for peers' asks
	Forwarded uint64 // asks sent to their owner
	Answered  uint64 // forwarded asks answered in time
	Fallback  uint64 // asks decided on a fallback bucket (owner unreachable or quiet, ask or answer lost or late, too many in flight), or on this node's bucket at the fallback rate (no majority)
	Late      uint64 // answers that came after their ask was decided otherwise, or matched no ask (probes included)
	Batches   uint64 // ask datagrams sent
	Charged   uint64 // units debited from this node's buckets for what peers admitted on their fallback buckets
	Unowed    uint64 // units admitted on fallback buckets that will not be charged to their owner: too many keys owed
}

// Plus returns s and o added field by field: the counters of several
// limiters.
func (s OwnedStats) Plus(o OwnedStats) OwnedStats {
	return OwnedStats{Local: s.Local + o.Local, Served: s.Served + o.Served, Forwarded: s.Forwarded + o.Forwarded,
		Answered: s.Answered + o.Answered, Fallback: s.Fallback + o.Fallback, Late: s.Late + o.Late, Batches: s.Batches + o.Batches,
		Charged: s.Charged + o.Charged, Unowed: s.Unowed + o.Unowed}
}

type ownedStats struct {
	local, served, forwarded, answered, fallback, late, batches, charged, unowed atomic.Uint64
}

// Ask is one decision of OwnedLimiter.AllowMany: Key and N in, Decision
// and Err out.
type Ask struct {
	Key      string
	N        int
	Decision throttle.Decision
	Err      error
}

// call is an ask forwarded and waiting for its answer.
type call struct {
	w     *waiter
	i     int    // the ask's index in w.asks
	owner string // the member it was sent to
}

// waiter is one AllowMany's forwarded asks.
type waiter struct {
	asks []Ask
	ids  []uint64 // of the asks forwarded
	left int      // forwarded asks not answered yet, +1 until all are enqueued; guarded by OwnedLimiter.mu
	done chan struct{}
}

// outbox collects the asks for one owner until they leave.
type outbox struct {
	asks  []askEntry
	size  int         // sealed size of the datagram they make
	sent  time.Time   // when the last datagram left
	timer *time.Timer // sends the asks Delay after sent, if armed
	quiet time.Time   // when an ask to the owner went unanswered; zero while it answers
	probe time.Time   // when the last probe left for a quiet owner
}

// take empties o, its datagram having left at now, and returns its asks.
func (o *outbox) take(header int, now time.Time) []askEntry {
	asks := o.asks
	o.asks, o.size, o.sent = nil, header, now
	return asks
}

// errNoRoute marks an ask that could not be sent: decided on the
// fallback bucket at once.
var errNoRoute = fmt.Errorf("gossip: owner not reachable")

// NewOwnedLimiter returns a limiter of buckets of burst tokens refilled
// at rate whose keys are decided by their owner (see OwnedLimiter), under
// name: the same name, rate and burst on every node. Names are separate
// from those of NewLimiter. At most one cfg may be given. Errors wrap
// throttle.ErrInvalid or throttle.ErrClosed.
func (n *Node) NewOwnedLimiter(name string, rate throttle.Rate, burst int, cfg ...OwnedConfig) (*OwnedLimiter, error) {
	var c OwnedConfig
	switch {
	case name == "" || len(name) > maxName:
		return nil, fmt.Errorf("%w: limiter name must have 1 to %d bytes", throttle.ErrInvalid, maxName)
	case len(cfg) > 1:
		return nil, fmt.Errorf("%w: more than one OwnedConfig", throttle.ErrInvalid)
	case len(cfg) == 1:
		c = cfg[0]
	}
	if c.Timeout < 0 || c.Delay < 0 {
		return nil, fmt.Errorf("%w: negative forward timeout or delay", throttle.ErrInvalid)
	}
	if _, err := gcra.NewConfig(rate, burst); err != nil {
		return nil, err
	}
	keyLen := min(n.settings.MaxKeyLen, maxKeyLen)
	if size := ownedHeaderSize(n.id, name) + maxAskSize(keyLen); size > MaxPacket {
		return nil, fmt.Errorf("%w: an ask for a key of %d bytes (throttle.WithMaxKeyLen) from node %q to limiter %q takes %d bytes, more than MaxPacket (%d): shorten them",
			throttle.ErrInvalid, keyLen, n.id, name, size, MaxPacket)
	}
	l := &OwnedLimiter{node: n, name: name, rate: rate, burst: burst, header: ownedHeaderSize(n.id, name),
		refill: rate.Duration(int64(burst)), timeout: cmp.Or(c.Timeout, DefaultForwardTimeout), delay: cmp.Or(c.Delay, DefaultForwardDelay),
		calls: map[uint64]call{}, out: map[string]*outbox{}}
	// Full buckets are swept every half refill time (within an interval
	// and a minute): a sweep reads every bucket, and one emptied just
	// before it cannot be full again sooner.
	sweep := min(max(rate.Duration(int64(burst))/2, n.Interval()), time.Minute)
	opts := []throttle.Option{throttle.WithMaxKeys(n.settings.MaxKeys), throttle.WithMaxKeyLen(keyLen),
		throttle.WithSweepInterval(sweep)}
	if n.settings.Clock != nil {
		opts = append(opts, throttle.WithClock(n.settings.Clock))
	}
	if err := l.exact.Init(rate, burst, opts...); err != nil {
		return nil, err
	}
	if err := l.fallback.Init(rate, burst, opts...); err != nil {
		l.exact.Close()
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	err := error(nil)
	switch {
	case n.closed:
		err = throttle.ErrClosed
	case n.owned[name] != nil:
		err = fmt.Errorf("%w: owned limiter %q already exists on this node", throttle.ErrInvalid, name)
	}
	if err != nil {
		l.exact.Close()
		l.fallback.Close()
		return nil, err
	}
	n.owned[name] = l
	return l, nil
}

// unregister removes l, registered under name in m (a map of n's,
// guarded by n.mu), unless another took its place.
func unregister[L comparable](n *Node, m map[string]L, name string, l L) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m[name] == l {
		delete(m, name)
	}
}

// Name returns the limiter's name.
func (l *OwnedLimiter) Name() string { return l.name }

// Owner returns the ID of key's owner as this node sees the members now.
func (l *OwnedLimiter) Owner(key string) string { return ownerOf(key, *l.node.own.owners.Load()) }

// Tokens returns the whole tokens in key's bucket on this node: the
// owner's exact bucket if this node owns key, else its fallback bucket.
func (l *OwnedLimiter) Tokens(key string) int64 {
	if l.Owner(key) == l.node.id {
		return l.exact.Tokens(key)
	}
	return l.fallback.Tokens(key)
}

// Stats returns the limiter's counters.
func (l *OwnedLimiter) Stats() OwnedStats {
	s := &l.st
	return OwnedStats{Local: s.local.Load(), Served: s.served.Load(), Forwarded: s.forwarded.Load(),
		Answered: s.answered.Load(), Fallback: s.fallback.Load(), Late: s.late.Load(), Batches: s.batches.Load(),
		Charged: s.charged.Load(), Unowed: s.unowed.Load()}
}

// Close closes the limiter: later calls fail with throttle.ErrClosed, and
// asks from peers are no longer answered (they fall back). Idempotent.
func (l *OwnedLimiter) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	unregister(l.node, l.node.owned, l.name, l)
	l.mu.Lock()
	for _, o := range l.out {
		if o.timer != nil {
			o.timer.Stop()
		}
	}
	clear(l.out)
	l.mu.Unlock()
	l.pmu.Lock()
	if l.payTimer != nil {
		l.payTimer.Stop()
	}
	l.pmu.Unlock()
	l.exact.Close()
	l.fallback.Close()
	return nil
}

// Allow decides n units of key: on this node's bucket if it owns key,
// else on the owner's, waiting for its answer up to the forward timeout
// or the end of ctx (then the error is ctx's), and on the key's fallback
// bucket if none comes in time. It decides on the fallback bucket at
// once while the owner has not answered lately (see OwnedLimiter), and
// for every key while this node hears no majority of the members.
func (l *OwnedLimiter) Allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	if err := l.check(key, n); err != nil {
		return d, err
	}
	if l.Owner(key) == l.node.id {
		l.st.local.Add(1)
		err = l.decideOwn(&d, key, n)
		return d, err
	}
	a := []Ask{{Key: key, N: n}}
	l.AllowMany(ctx, a)
	return a[0].Decision, a[0].Err
}

func (l *OwnedLimiter) check(key string, n int) error {
	if l.closed.Load() {
		return throttle.ErrClosed
	}
	if err := l.node.settings.CheckKey(key); err != nil {
		return err
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("%w: key of %d bytes is longer than %d", throttle.ErrInvalid, len(key), maxKeyLen)
	}
	return limiterkit.CheckN(n, l.burst)
}

// AllowMany decides every ask as Allow would, forwarding those of each
// owner together, and waits for all of them at once: one round trip for
// the lot, not one each.
func (l *OwnedLimiter) AllowMany(ctx context.Context, asks []Ask) {
	members, quorum := *l.node.own.owners.Load(), l.node.own.quorum.Load()
	// left starts at 1, for the enqueueing: answers that come before the
	// last ask is enqueued must not complete w.
	w := &waiter{asks: asks, done: make(chan struct{}), left: 1}
	var sends []batch
	var owners []string
	for i := range asks {
		a := &asks[i]
		if a.Err = l.check(a.Key, a.N); a.Err != nil {
			continue
		}
		owner := ownerOf(a.Key, members)
		if !quorum && owner != l.node.id {
			a.Err = errNoRoute // decided on the fallback bucket by wait
			continue
		}
		if owner == l.node.id {
			l.st.local.Add(1)
			a.Err = l.decideOwn(&a.Decision, a.Key, a.N)
			continue
		}
		if full := l.enqueue(w, i, owner); full != nil {
			sends = append(sends, batch{owner, full})
		}
		if !slices.Contains(owners, owner) {
			owners = append(owners, owner)
		}
	}
	l.mu.Lock()
	for _, owner := range owners {
		if b := l.take(owner, false); b.asks != nil {
			sends = append(sends, b)
		}
	}
	w.finish()
	l.mu.Unlock()
	for _, b := range sends {
		l.send(b.owner, b.asks)
	}
	l.wait(ctx, w)
}

// batch is the asks of one datagram to an owner.
type batch struct {
	owner string
	asks  []askEntry
}

// enqueue adds ask i of w to the outbox of owner, and returns the
// outbox's asks to send now if the datagram is full. Past maxInFlight
// asks waiting, or while the owner is quiet (an ask to it went
// unanswered and no answer came since), the ask is marked to fall back at
// once; a quiet owner is still sent one such ask per timeout, as a probe
// that no caller waits for (its answer ends the quiet).
func (l *OwnedLimiter) enqueue(w *waiter, i int, owner string) (full []askEntry) {
	a := &w.asks[i]
	l.mu.Lock()
	defer l.mu.Unlock()
	o, now := l.box(owner), time.Now()
	quiet := !o.quiet.IsZero()
	if quiet || len(l.calls) >= maxInFlight {
		a.Err = errNoRoute
		if !quiet || now.Sub(o.probe) < l.timeout {
			return nil
		}
		o.probe = now
	}
	l.next++
	e := askEntry{id: l.next, key: a.Key, n: uint64(a.N)}
	if a.Err == nil {
		l.calls[e.id] = call{w: w, i: i, owner: owner}
		w.ids = append(w.ids, e.id)
		w.left++
	}
	if o.size+e.size() > MaxPacket && len(o.asks) > 0 {
		full = o.take(l.header, now)
	}
	o.asks = append(o.asks, e)
	o.size += e.size()
	return full
}

// box returns owner's outbox, made if there is none. Called with l.mu
// held.
func (l *OwnedLimiter) box(owner string) *outbox {
	o := l.out[owner]
	if o == nil {
		o = &outbox{size: l.header}
		l.out[owner] = o
	}
	return o
}

// take returns the asks of owner's outbox to send now, if any: all of
// them if force or no datagram left for owner within the last Delay;
// else it arms the timer that sends them Delay after the last one left.
// Called with l.mu held.
func (l *OwnedLimiter) take(owner string, force bool) batch {
	o := l.out[owner]
	if o == nil || len(o.asks) == 0 {
		return batch{}
	}
	now := time.Now()
	if wait := l.delay - now.Sub(o.sent); wait > 0 && !force {
		if o.timer == nil {
			o.timer = time.AfterFunc(wait, func() { l.flush(owner) })
		}
		return batch{}
	}
	if o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
	return batch{owner, o.take(l.header, now)}
}

// flush sends the asks collected for owner, if any: its timer fired,
// Delay after the last datagram left.
func (l *OwnedLimiter) flush(owner string) {
	l.mu.Lock()
	if o := l.out[owner]; o != nil {
		o.timer = nil
	}
	b := l.take(owner, true)
	l.mu.Unlock()
	if b.asks != nil {
		l.send(owner, b.asks)
	}
}

// send sends asks to owner in one datagram (more if they do not fit).
// If it cannot (owner not heard from yet, or gone), they fall back at
// once.
func (l *OwnedLimiter) send(owner string, asks []askEntry) {
	n := l.node
	e := &encoder{hdr: header{typ: msgAsk, sender: n.id, table: l.name, incarnation: n.incarnation.Load(),
		round: uint64(n.tick.Load()), start: n.created}}
	for _, a := range asks {
		e.addAsk(a)
	}
	bodies := e.finish()
	if n.sendDirect(owner, bodies, 1) {
		l.st.forwarded.Add(uint64(len(asks)))
		l.st.batches.Add(uint64(len(bodies)))
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range asks {
		if c, ok := l.calls[a.id]; ok {
			delete(l.calls, a.id)
			c.w.asks[c.i].Err = errNoRoute
			c.w.finish()
		}
	}
}

// finish counts one forwarded ask of w as done. Called with
// OwnedLimiter.mu held.
func (w *waiter) finish() {
	if w.left--; w.left == 0 {
		close(w.done)
	}
}

// wait waits for w's answers, up to the timeout or the end of ctx, and
// decides those not answered (or not sent) on the fallback buckets.
func (l *OwnedLimiter) wait(ctx context.Context, w *waiter) {
	timedOut := false
	if len(w.ids) > 0 {
		t := time.NewTimer(l.timeout)
		select {
		case <-w.done:
		case <-t.C:
			timedOut = true
		case <-ctx.Done():
		}
		t.Stop()
	}
	cerr, now := ctx.Err(), time.Now()
	l.mu.Lock()
	for _, id := range w.ids {
		if c, ok := l.calls[id]; ok {
			delete(l.calls, id)
			c.w.asks[c.i].Err = errNoRoute
			if cerr != nil {
				c.w.asks[c.i].Err = cerr
			} else if o := l.box(c.owner); timedOut && o.quiet.IsZero() {
				o.quiet = now // its next asks fall back at once, but for a probe
			}
		}
	}
	l.mu.Unlock()
	members := int(l.node.size.Load())
	for i := range w.asks {
		if a := &w.asks[i]; a.Err == errNoRoute {
			l.st.fallback.Add(1)
			a.Err = l.decideFallback(&a.Decision, a.Key, a.N, members)
		}
	}
}

// decideFallback decides n units of key on its fallback bucket: the
// limit's rate and burst divided by the configured members, live or not
// (burst at least 1). What it admits is owed to the key's owner (see
// payBack).
func (l *OwnedLimiter) decideFallback(d *throttle.Decision, key string, n, members int) error {
	err := l.decideScaled(&l.fallback, d, key, n, members)
	if err == nil && d.Allowed {
		l.owe(key, int64(n))
	}
	return err
}

// decideScaled decides n units of key on its bucket in b read at the
// limit's rate and burst divided by members (burst at least 1).
func (l *OwnedLimiter) decideScaled(b *gcra.Keyed, d *throttle.Decision, key string, n, members int) error {
	members = max(members, 1)
	rate := throttle.NewRate(int(l.rate.Count()), l.rate.Period()*time.Duration(members))
	burst := max(1, l.burst/members)
	if n > burst {
		limiterkit.Fill(d, false, int64(l.burst), 0, int64(rate.Duration(int64(n))), int64(rate.Duration(int64(burst))))
		return nil
	}
	err := b.AllowWith(d, key, n, rate, burst)
	d.Limit = l.burst
	return err
}

// sendDirect seals bodies for peer addr, outside the rounds, and sends
// them copies times (a copy shares its sequence number: applied once). It
// reports false, sending nothing, if the node cannot: no transport, not a
// peer, or a peer whose incarnation it does not know yet (owner-routing
// messages must name it).
func (n *Node) sendDirect(addr string, bodies [][]byte, copies int) bool {
	if n.cfg.Transport == nil {
		return false
	}
	n.mu.Lock()
	pr := n.peers[addr]
	if n.closed || pr == nil || pr.incarnation == 0 {
		n.mu.Unlock()
		return false
	}
	sealed := make([][]byte, len(bodies))
	for i, b := range bodies {
		pr.seq++
		sealed[i] = n.sendSig.seal(b, addr, header{parts: 1, seq: pr.seq, dstInc: pr.incarnation})
	}
	n.mu.Unlock()
	ok := true
	for _, p := range slices.Repeat(sealed, copies) {
		if err := n.cfg.Transport.Send(addr, p); err != nil {
			n.st.sendErr.Add(1)
			ok = false
			continue
		}
		n.st.sent.Add(1)
		n.st.bytes.Add(uint64(len(p)))
	}
	return ok
}

// ownedMsg reports whether typ is a message of owner routing.
func ownedMsg(typ byte) bool { return typ == msgAsk || typ == msgAnswer || typ == msgCharge }

// applyOwned handles an admitted ask or answer. It returns the counter of
// why it could not (no owned limiter of that name: asks are then answered
// at once that they cannot be decided here, see refuseAsks).
func (n *Node) applyOwned(m *message) *atomic.Uint64 {
	n.mu.Lock()
	l := n.owned[m.table]
	n.mu.Unlock()
	if l == nil || l.closed.Load() {
		if m.typ == msgAsk {
			n.refuseAsks(m)
		}
		return &n.st.unknownTable
	}
	switch m.typ {
	case msgAsk:
		l.serve(m)
	case msgAnswer:
		l.answered(m)
	case msgCharge:
		l.charged(m)
	}
	return nil
}

// serve decides a peer's asks on this node's buckets and answers them in
// one datagram (more if they do not fit). The asks need not be keys this
// node owns: the members' views may differ for a moment.
func (l *OwnedLimiter) serve(m *message) {
	n := l.node
	e := &encoder{hdr: header{typ: msgAnswer, sender: n.id, table: l.name, incarnation: n.incarnation.Load(),
		round: uint64(n.tick.Load()), start: n.created}}
	var d throttle.Decision
	for _, a := range m.asks {
		ans := answerEntry{id: a.id, verdict: verdictErr}
		if int(a.n) <= l.burst && l.decideOwn(&d, a.key, int(a.n)) == nil {
			ans.verdict = verdictNo
			if d.Allowed {
				ans.verdict = verdictOK
			}
			ans.remaining, ans.retry, ans.reset = uint64(max(d.Remaining, 0)), uint64(max(d.RetryAfter, 0)), uint64(max(d.ResetAfter, 0))
		}
		e.addAnswer(ans)
	}
	l.st.served.Add(uint64(len(m.asks)))
	n.sendDirect(m.sender, e.finish(), 1)
}

// refuseAsks answers every ask of m, for an owned limiter this node does
// not have (a reload that changes a limit gives it a new name, and reaches
// the nodes one after the other; or a limiter closed), that it cannot be
// decided here: the asker decides on its fallback bucket at once instead
// of after its timeout, and does not take this node for quiet.
func (n *Node) refuseAsks(m *message) {
	e := &encoder{hdr: header{typ: msgAnswer, sender: n.id, table: m.table, incarnation: n.incarnation.Load(),
		round: uint64(n.tick.Load()), start: n.created}}
	for _, a := range m.asks {
		e.addAnswer(answerEntry{id: a.id, verdict: verdictErr})
	}
	n.sendDirect(m.sender, e.finish(), 1)
}

// answered completes the asks a peer's answer decides.
func (l *OwnedLimiter) answered(m *message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if o := l.out[m.sender]; o != nil {
		o.quiet = time.Time{} // it answers: ask it again
	}
	for _, a := range m.answers {
		c, ok := l.calls[a.id]
		if !ok || c.owner != m.sender {
			l.st.late.Add(1)
			continue
		}
		delete(l.calls, a.id)
		ask := &c.w.asks[c.i]
		if a.verdict == verdictErr {
			ask.Err = errNoRoute
		} else {
			limiterkit.Fill(&ask.Decision, a.verdict == verdictOK, int64(l.burst), int64(a.remaining),
				int64(min(a.retry, math.MaxInt64)), int64(min(a.reset, math.MaxInt64)))
			l.st.answered.Add(1)
		}
		c.w.finish()
	}
}

// ownerOf returns the member of members (sorted IDs) that owns key: the
// highest weight of the key and member ID, so that a member joining or
// leaving moves only the keys it wins or held.
func ownerOf(key string, members []string) string {
	best, bw := "", uint64(0)
	for _, m := range members {
		if w := weight(key, m); best == "" || w > bw {
			best, bw = m, w
		}
	}
	return best
}

// weight hashes member and key (FNV-1a, then a 64-bit finalizer that
// spreads the bits), the same on every node.
func weight(key, member string) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(member); i++ {
		h = (h ^ uint64(member[i])) * prime
	}
	h = (h ^ 0xff) * prime // separates member from key
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	return h ^ h>>33
}
