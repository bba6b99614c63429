package gossip

import (
	"slices"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// catchUp is the state sync of one peer that joined or restarted: the
// entries of every limiter whose bucket was below full when it began,
// whose levels the rounds send the peer a budget at a time, in a fixed
// order, from where the acknowledged part ends. Guarded by Node.mu, but
// for es and ends, which are set once, before the first round sends.
type catchUp struct {
	inc   uint64               // the peer's incarnation it is for
	lims  []*Limiter           // sorted by name
	ends  []int                // es[ends[i-1]:ends[i]] are the entries of lims[i]
	es    []*entry             // nil until the first round takes the snapshot
	acked int                  // the peer has the levels of es[:acked]...
	next  int                  // ...and was sent those of es[:next]
	sent  map[uint64]stateSent // by round
}

// stateSent is what one round's state datagrams carried: the levels of
// es[from:to], those of es[starts[k]:] (to the next start) in the round's
// datagram first+k.
type stateSent struct {
	first    int
	from, to int
	starts   []int
}

// stateTimeout is how many rounds a state datagram may go unacknowledged
// before the catch-up goes back to the end of the acknowledged part: a
// round's acknowledgement comes with the peer's next round, about one
// round later.
const stateTimeout = 2

// snapshot records the entries of lims whose buckets are below full now.
func (c *catchUp) snapshot(lims []*Limiter, now int64) {
	c.lims = lims
	for _, l := range lims {
		l.table.each(func(_ string, e *entry) {
			if l.bucket.Tokens(now, e.tat()) < int64(l.burst) {
				c.es = append(c.es, e)
			}
		})
		c.ends = append(c.ends, len(c.es))
	}
	if c.es == nil {
		c.es = []*entry{} // taken, and empty
	}
}

// resume returns where round r's state starts: after what was sent, or,
// if a round sent stateTimeout rounds ago or more is not acknowledged in
// full, after what was acknowledged. Called with Node.mu held.
func (c *catchUp) resume(r int64) int {
	for s, x := range c.sent {
		switch {
		case x.to <= c.acked:
			delete(c.sent, s)
		case int64(s) <= r-stateTimeout:
			c.next = c.acked
			clear(c.sent)
			return c.next
		}
	}
	return c.next
}

// done reports whether the peer has every level. Called with Node.mu
// held.
func (c *catchUp) done() bool { return c.es != nil && c.acked >= len(c.es) }

// ack advances what the peer has from its acknowledgements in m: of a
// round it got in full, or of the leading datagrams of one. Called with
// Node.mu held.
func (c *catchUp) ack(m *message) {
	if s, ok := c.sent[m.ack]; ok && s.from <= c.acked {
		c.acked = max(c.acked, s.to)
	}
	if s, ok := c.sent[m.pround]; ok && s.from <= c.acked && int(m.prefix) > s.first {
		if k := int(m.prefix) - s.first; k < len(s.starts) {
			c.acked = max(c.acked, s.starts[k])
		} else {
			c.acked = max(c.acked, s.to)
		}
	}
}

// stateEntryBytes is what a state entry is counted in a round's budget,
// its key aside: its four varints at about their usual sizes.
const stateEntryBytes = 24

// bodies returns the state datagrams of round r for peer (at incarnation
// inc) from es[from:], at most budget bytes of entries (one at least):
// the levels of the entries below full now. It returns where each
// datagram starts in es and where the last one ends.
func (c *catchUp) bodies(n *Node, r int64, from, budget int, peer string, inc uint64) (out [][]byte, starts []int, to int) {
	now := n.clk.Now()
	size := 0
	to = from
	for li, l := range c.lims {
		if to >= c.ends[li] {
			continue
		}
		var sts []stateEntry
		var idx []int
		for ; to < c.ends[li] && (size <= budget || len(idx) == 0); to++ {
			if s, ok := l.stateOf(c.es[to], now, peer, inc); ok {
				sts = append(sts, s)
				idx = append(idx, to)
				size += len(s.key) + stateEntryBytes
			}
		}
		if len(sts) > 0 {
			e := &encoder{hdr: header{typ: msgState, sender: n.id, table: l.name, incarnation: n.incarnation.Load(), round: uint64(r), start: n.created}}
			for _, s := range sts {
				e.addState(s)
			}
			out = append(out, e.finish()...)
			k := 0
			for _, cnt := range e.counts {
				starts = append(starts, idx[k])
				k += cnt
			}
		}
		if size > budget {
			break
		}
	}
	return out, starts, to
}

// stateOf returns the state entry of e for peer (at incarnation inc) at
// now, and false if its bucket is full or it was dropped: its level, and
// how many of the peer's own hits it already includes, so that the peer
// does not lose the hits it made since it started.
func (l *Limiter) stateOf(e *entry, now int64, peer string, inc uint64) (stateEntry, bool) {
	if e.pin.Load() < 0 {
		return stateEntry{}, false
	}
	// This node's own counter, read before the level: the level includes
	// at least these hits (a hit is counted after its bucket admits it),
	// so the receiver, which takes them as delivered, never charges one
	// the level missed.
	born, mine := e.born.Load(), e.hits.Load()
	t := l.bucket.Tokens(now, e.tat())
	if t >= int64(l.burst) {
		return stateEntry{}, false
	}
	s := stateEntry{key: e.key, tokens: t, born: max(born, 0), mine: uint64(max(mine, 0))}
	e.mu.Lock()
	if rec := e.peerRec(peer); rec != nil && rec.inc == inc {
		s.yours = rec.hits
	}
	e.mu.Unlock()
	return s, true
}

// catchUpBodies returns the state datagrams of round r for the peer at
// addr (incarnation inc) that c catches up, at most budget bytes of
// entries, the first of which is datagram first of the round, and
// records what they carry. It takes c's snapshot of lims in its first
// round.
func (n *Node) catchUpBodies(c *catchUp, lims []*Limiter, r int64, budget, first int, addr string, inc uint64) [][]byte {
	n.mu.Lock()
	fresh := c.es == nil
	n.mu.Unlock()
	if fresh {
		var s catchUp
		s.snapshot(slices.Clone(lims), n.clk.Now())
		n.mu.Lock()
		if c.es == nil {
			c.lims, c.ends, c.es = s.lims, s.ends, s.es
		}
		n.mu.Unlock()
	}
	n.mu.Lock()
	from := c.resume(r)
	n.mu.Unlock()
	if from >= len(c.es) {
		return nil
	}
	out, starts, to := c.bodies(n, r, from, budget, addr, inc)
	n.mu.Lock()
	if c.sent == nil {
		c.sent = map[uint64]stateSent{}
	}
	c.sent[uint64(r)] = stateSent{first: first, from: from, to: to, starts: starts}
	c.next = max(c.next, to)
	n.mu.Unlock()
	return out
}

// catchingUp returns the catch-up the peer's round sends levels for, nil
// if none: a new one if the peer is new or restarted, none once it has
// every level. Called with Node.mu held.
func (p *peer) catchingUp() *catchUp {
	if p.needState {
		p.needState = false
		p.catchUp = &catchUp{inc: p.incarnation}
	}
	if c := p.catchUp; c != nil && (c.inc != p.incarnation || c.done()) {
		p.catchUp = nil
	}
	return p.catchUp
}

// ackCatchUp takes the acknowledgements of m, from the peer, for the
// levels it was sent; and, as the levels follow the reports in a round,
// a round whose report datagrams all arrived though some of its levels
// did not delivers its reports. Called with Node.mu held.
func (p *peer) ackCatchUp(m *message) {
	if c := p.catchUp; c != nil && c.inc == p.incarnation {
		c.ack(m)
	}
	cur := p.ackedPos
	cur.ch = int64(p.acked)
	if sr, ok := p.sent[m.pround]; ok && len(sr.parts) > 0 && int(m.prefix) >= len(sr.parts) && sr.from.cmp(cur) <= 0 && sr.to.cmp(cur) > 0 {
		p.acked, p.ackedPos = uint64(sr.to.ch), sr.to
	}
}

// rxCatchUp follows, from a peer's rounds, whether the peer has sent this
// node every bucket level it is catching up: a complete round of the peer
// addressed to this node's life that carries no level says so (the peer
// sends levels in every round until they are acknowledged, or waits one
// round for the acknowledgement, then sends again what was lost), and
// two in a row say so for sure. Guarded by Node.mu.
type rxCatchUp struct {
	round        uint64 // the peer's round the flags are of
	state, other bool   // that round carried levels / a datagram for another life of this node
	clean        uint8  // consecutive complete rounds before round without levels, all for this life
}

// note records m, a datagram of the peer's round m.round, before the
// peer's receive state takes it: rxRound is the peer round that state is
// at, complete whether it arrived in full, and self this node's life.
func (x *rxCatchUp) note(m *message, rxRound uint64, complete bool, self uint64) {
	if m.round > x.round {
		if m.round == x.round+1 && rxRound == x.round && complete && !x.state && !x.other {
			x.clean = min(x.clean+1, 255)
		} else {
			x.clean = 0
		}
		x.round, x.state, x.other = m.round, false, false
	}
	if m.round == x.round {
		x.state = x.state || m.typ == msgState
		x.other = x.other || m.dstInc != self
	}
}

// startSilence is how many intervals a node that has peers waits, from
// its start, for a datagram of each before it takes the silent ones for
// absent: every live peer sends one at its first round boundary after
// this node's start (one interval at most), and the margin covers the
// delivery and a round's work.
const startSilence = 2

// gateStart engages the start gate of a node that has peers, or a
// Membership that may report them later: until it has heard from them,
// it cannot tell a first start of the cluster (its peers started about
// when it did) from a restart or a late join (a peer started more than
// an interval before it, and may have emptied buckets this node holds
// full), so it decides conservatively (see Limiter.gated) from its first
// decision. The gate lifts as soon as every peer not declared dead was
// heard and none started earlier (noteStart), or startSilence intervals
// after the start if the silent peers may be taken for absent
// (liftStart); a peer that started earlier turns it into the catch-up
// gate. Peers that arrive later within those intervals (a Membership's,
// or Join's) engage it too (addPeer).
func (n *Node) gateStart() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cfg.Transport == nil || (len(n.peers) == 0 && n.cfg.Membership == nil) {
		return
	}
	n.engageStart()
}

// engageStart engages the start gate unless the node's first startSilence
// intervals are over or its gate is engaged or lifted for good. The
// silence alone does not lift it (see liftStart). Called with n.mu held.
func (n *Node) engageStart() {
	end := n.created + startSilence*n.interval
	if n.gateDone || n.gated.Load() || n.clk.Now() >= end {
		return
	}
	n.startGate = true
	n.gated.Store(true)
}

// noteStart records when the peer's current life started, from m (an
// authentic datagram of the peer's). If that was more than an interval
// before this node started, this node joined late or restarted, and the
// peer has levels for it: the gate holds until it has them (gate).
// Otherwise, once every peer not declared dead was heard so, the start
// gate lifts: a first start of the cluster. Owner routing learns the
// same of its start (ownership.heard), from every such datagram, even one
// then dropped as addressed to an earlier life of this node. Called with
// n.mu held.
func (n *Node) noteStart(pr *peer, m *message) {
	if m.incarnation < max(pr.incarnation, pr.floor) {
		return // from an earlier life of the peer
	}
	pr.start = m.start
	earlier := m.start < n.created-n.interval
	n.own.heard(earlier, !earlier && n.own.start.Load() == startUnknown && n.heardAll())
	switch {
	case n.gateDone:
	case m.start < n.created-n.interval:
		n.startGate = false
		n.gated.Store(true)
	case n.startGate && n.heardAll():
		n.startGate = false
		n.gated.Store(false)
	default:
		n.liftStart(n.clk.Now()) // the silence is over, and m the first peer heard
	}
}

// heardAll reports whether every peer not declared dead has been heard
// in its current life. Called with n.mu held.
func (n *Node) heardAll() bool {
	for _, p := range n.peers {
		if p.start == 0 && !p.down {
			return false
		}
	}
	return true
}

// gate lifts the start gate once its silence is over (liftStart, at now,
// the round's start), and the catch-up gate, for good, once a live
// peer that started more than an interval before this node has sent it
// every level (each such peer's levels include what every member
// reported to it), or none is left alive. While the gate is engaged,
// this node decides each key conservatively (see Limiter.gated). Called
// with n.mu held, once a round.
func (n *Node) gate(now int64) {
	if !n.gated.Load() {
		return
	}
	if n.startGate {
		n.liftStart(now)
		return
	}
	waiting := false
	for _, p := range n.peers {
		if p.start == 0 || p.start >= n.created-n.interval || p.dead || p.down {
			continue
		}
		if p.rx.clean >= 2 {
			waiting = false // one peer's levels are enough
			break
		}
		waiting = true // still sending levels
	}
	if waiting {
		return
	}
	n.gated.Store(false)
	n.gateDone = true
}

// liftStart lifts the start gate, if engaged, once the node's first
// startSilence intervals are over at now and it has heard enough to tell
// a first start: one peer at least, the silent ones taken for absent,
// and with a Membership every member it reports alive. A node that heard
// no peer cannot tell peers that are not running from peers that are
// slow or cut off from it (nor can its membership, if it reports none:
// a restart into a partition), so it stays gated until one speaks: its
// buckets as if empty at its start, which costs at most a burst per key
// in this life. Called with n.mu held.
func (n *Node) liftStart(now int64) {
	if !n.startGate || now < n.created+startSilence*n.interval {
		return
	}
	if !n.heardAny() || n.cfg.Membership != nil && !n.heardAll() {
		return
	}
	n.startGate = false
	n.gated.Store(false)
}

// heardAny reports whether some peer has been heard in its current life.
// Called with n.mu held.
func (n *Node) heardAny() bool {
	for _, p := range n.peers {
		if p.start != 0 {
			return true
		}
	}
	return false
}

// gated reports whether the gate denies n units of e at now, and if so
// fills d. While a node has not heard from its peers since it started
// (Node.gateStart), or, having started late, has not caught up
// (Node.gate), a key's admissions in this life stay within what its
// bucket would have refilled had it been empty at the start: its peers
// may have emptied it, and their levels of it may not have arrived yet.
// Racing decisions may each pass it.
func (l *Limiter) gated(d *throttle.Decision, e *entry, now int64, n int) bool {
	if !l.node.gated.Load() {
		return false
	}
	since, need := now-l.node.created, int64(l.rate.Duration(e.hits.Load()+int64(n)))
	if need <= since {
		return false
	}
	limiterkit.Fill(d, false, int64(l.burst), 0, need-since, untilFull(now, e.tat()))
	return true
}
