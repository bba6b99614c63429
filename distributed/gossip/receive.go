package gossip

import (
	"errors"
	"math"
	"sync/atomic"
)

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
	m, err := decode(n.recvSig, p, maxKeyLen, n.id)
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
		n.pruneEarly(n.tick.Load(), m.sender, m.incarnation)
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
	if pr.dead {
		pr.dead = false // back in the shares
		n.publishMembers()
	}
	if m.typ != msgHello {
		l = n.limiters[m.table]
	}
	if l == nil && (m.typ == msgReport || m.typ == msgState) {
		n.keepEarly(m, pr.acceptFrom) // for when the limiter is created
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

// apply debits what an admitted report or state carries from l. It
// returns the counter of why it could not (a limiter this node lacks: the
// message was kept for when it is created, see keepEarly).
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
