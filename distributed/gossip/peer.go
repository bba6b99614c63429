package gossip

import "sync/atomic"

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
