package gossip

import (
	"fmt"
	"slices"

	"github.com/throttlekit/throttle"
)

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
		n.removePeer(id)
	}
	n.publishMembers()
	if e.Kind != MemberJoin {
		n.liftStart(n.clk.Now()) // a silent member it waited for is gone
	}
}

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
	n.peers[addr] = &peer{addr: addr, added: now, acceptFrom: now - n.interval, seq: n.leftSeq}
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
	n.removePeer(addr)
	n.publishMembers()
}

// removePeer forgets the peer at addr but for the sequence numbers sent
// to it: the peer may still have this node (it was not told), and drops
// as replayed every datagram numbered at or below those it got before,
// so a peer added later within this life is numbered from above them
// (one number for every peer that left: a fresh peer takes any start).
// Called with n.mu held.
func (n *Node) removePeer(addr string) {
	if p := n.peers[addr]; p != nil {
		n.leftSeq = max(n.leftSeq, p.seq)
		delete(n.peers, addr)
	}
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
