package gossip

import (
	"slices"
	"sync/atomic"
)

// ownership is who owns the keys of a node's owned limiters, published
// under Node.mu for the deciding calls to read lock-free. The zero value
// is a node that has published nothing yet.
type ownership struct {
	owners atomic.Pointer[[]string] // sorted IDs of the members that own keys
	quorum atomic.Bool              // this node hears a majority of the configured members, itself included
	moved  atomic.Int64             // ns: when this node last may have gained keys; 0 if never
	start  atomic.Int32             // startUnknown, startFirst or startLate: see heard
}

// What a node knows of its start, from its peers' start times.
const (
	startUnknown = iota // not every peer heard yet, and none that ran before it
	startFirst          // every peer heard, each started with it: a cluster's first start
	startLate           // a peer that ran before it: a restart, or a join into a running cluster
)

// heard records what a peer just heard says of this node's start: earlier
// if the peer started more than an interval before this node (as the
// catch-up of all-to-all tells a restart); all if every peer not declared
// dead has now been heard in its current life. A peer that started with
// this node proves nothing alone: it may have restarted with it while a
// peer that ran all along, and holds the keys' history, is not heard yet
// (the first start is taken only once every peer was heard).
func (o *ownership) heard(earlier, all bool) {
	switch st := o.start.Load(); {
	case st == startLate:
	case earlier:
		o.start.Store(startLate)
	case st == startUnknown && all:
		o.start.CompareAndSwap(startUnknown, startFirst)
	}
}

// publishOwners publishes the owners of keys and whether this node has a
// quorum, reachable being this node and the peers it hears. The owners
// are the members the membership does not declare dead: the node's own
// silence rule does not move keys (it only counts for the quorum), so a
// loss in one direction does not give a key a second owner while the
// membership reports every member alive. With Config.Peers (a
// StaticMembership that declares no one dead) keys move only when the
// peers change. Called with n.mu held.
func (n *Node) publishOwners(reachable int) {
	owners := []string{n.id}
	for a, p := range n.peers {
		if !p.down {
			owners = append(owners, a)
		}
	}
	slices.Sort(owners)
	quorum := 2*reachable > len(n.peers)+1
	if old := n.own.owners.Load(); old != nil {
		// This node may gain keys when a member leaves the owners or when
		// it gets its quorum back: buckets it creates then start empty
		// (see OwnedLimiter.startCold).
		lost := slices.ContainsFunc(*old, func(m string) bool { _, found := slices.BinarySearch(owners, m); return !found })
		back := quorum && !n.own.quorum.Load()
		if lost || back {
			n.own.moved.Store(n.clk.Now())
		}
		if back {
			// Without a quorum this node decided every key on its
			// fallback buckets, and the others may have decided its keys
			// meanwhile: the buckets it kept are stale. Empty them.
			for _, l := range n.owned {
				go l.exact.EmptyAll()
			}
		}
	}
	n.own.quorum.Store(quorum)
	n.own.owners.Store(&owners)
}

// coldSince returns the instant (ns) from which a bucket of a key this
// node owns, created now, is taken as emptied: the latest move of keys to
// this node, or its start if it restarted or joined a running cluster, or
// has not heard every peer yet (a node restarted where it reaches no
// member may take itself for a cluster of one, and one that hears only a
// peer restarted with it for a first start); 0 if none. A node without a
// transport, or created with no peers and no Membership, is a cluster of
// one: its start is not cold (no other node can have decided its keys;
// like a standalone daemon it restarts full).
func (n *Node) coldSince() int64 {
	since := n.own.moved.Load()
	alone := n.cfg.Transport == nil || (n.cfg.Membership == nil && len(n.cfg.Peers) == 0)
	if n.own.start.Load() != startFirst && !alone {
		since = max(since, n.created)
	}
	return since
}
