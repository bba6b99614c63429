package gossip

import (
	"cmp"
	"maps"
	"slices"
)

// Reports and states for a limiter this node does not have yet are kept,
// bounded, and applied when it is created (see NewLimiter): a limit rolled
// out node by node is a new limiter on each node in turn, and a peer's
// counters are cumulative and their receipt acknowledged, so a node that
// dropped them would learn what an earlier node took under the new limit
// only from that node's next report, and would start its bucket full
// meanwhile. An authenticated peer cannot grow what is kept past the
// bounds below: a new name past earlyTables evicts the name heard from
// least recently, a name's messages past earlyBytes evict its oldest,
// and messages are dropped earlyRounds after they arrived, or once
// their sender's incarnation moved on.
const (
	earlyTables = 8         // names kept at once
	earlyBytes  = 256 << 10 // estimated memory of the messages kept per name
	earlyRounds = 64        // rounds a message is kept
)

// earlyMsg is a message kept for a limiter this node does not have.
// Its keys alias the message's own copy of the datagram (see decode).
type earlyMsg struct {
	m          *message
	acceptFrom int64 // the sender's, when it arrived (see Node.admit)
	round      int64 // this node's round when it arrived
	size       int   // estimated memory
}

// earlyTable is what is kept for one limiter name, in arrival order.
type earlyTable struct {
	msgs []earlyMsg
	size int
	last int64 // the round of the latest arrival
}

// msgSize estimates the memory m holds: the message, its copy of the
// datagram (keys and numbers) and its entries.
func msgSize(m *message) int {
	s := 256 + len(m.sender) + len(m.table)
	for _, x := range m.reports {
		s += 72 + len(x.key)
	}
	for _, x := range m.states {
		s += 96 + len(x.key)
	}
	return s
}

// keepEarly keeps m, a report or state for a limiter this node does not have,
// admitted from a peer whose counters are debited from acceptFrom. Called
// with n.mu held.
func (n *Node) keepEarly(m *message, acceptFrom int64) {
	r := n.tick.Load()
	pt := n.early[m.table]
	if pt == nil {
		if n.early == nil {
			n.early = map[string]*earlyTable{}
		}
		if len(n.early) >= earlyTables {
			oldest := slices.MinFunc(slices.Sorted(maps.Keys(n.early)), func(a, b string) int {
				return cmp.Compare(n.early[a].last, n.early[b].last)
			})
			delete(n.early, oldest)
		}
		pt = &earlyTable{}
		n.early[m.table] = pt
	}
	p := earlyMsg{m: m, acceptFrom: acceptFrom, round: r, size: msgSize(m)}
	pt.msgs = append(pt.msgs, p)
	pt.size += p.size
	pt.last = r
	drop := 0
	for pt.size > earlyBytes {
		pt.size -= pt.msgs[drop].size
		drop++
	}
	pt.msgs = slices.Delete(pt.msgs, 0, drop)
}

// pruneEarly drops the messages kept longer than earlyRounds, before
// round r, and those of an incarnation of sender older than inc (sender
// "" for none). Called with n.mu held.
func (n *Node) pruneEarly(r int64, sender string, inc uint64) {
	for name, pt := range n.early {
		pt.msgs = slices.DeleteFunc(pt.msgs, func(p earlyMsg) bool {
			if r-p.round > earlyRounds || (p.m.sender == sender && p.m.incarnation < inc) {
				pt.size -= p.size
				return true
			}
			return false
		})
		if len(pt.msgs) == 0 {
			delete(n.early, name)
		}
	}
}

// takeEarly removes and returns the messages kept for l's name that
// arrived within its retention from a peer still a member, in the life
// it has now. Called with n.mu held.
func (n *Node) takeEarly(l *Limiter) []earlyMsg {
	pt := n.early[l.name]
	if pt == nil {
		return nil
	}
	delete(n.early, l.name)
	r := n.tick.Load()
	return slices.DeleteFunc(pt.msgs, func(p earlyMsg) bool {
		pr := n.peers[p.m.sender]
		return r-p.round > l.retain || pr == nil || p.m.incarnation < pr.incarnation
	})
}

// applyEarly applies to l, in arrival order, the messages kept for it
// before it was created. l is registered already: a datagram that arrives
// meanwhile is applied beside them, as concurrent datagrams are: it is
// charged as a datagram reordered by the network would be (counters are
// cumulative, so of two reports of a counter the later applied adds only
// what the earlier lacked).
func (n *Node) applyEarly(l *Limiter, msgs []earlyMsg) {
	for _, p := range msgs {
		n.apply(p.m, l, p.acceptFrom)
	}
}
