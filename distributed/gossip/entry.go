package gossip

import (
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttle/internal/gcra"
)

// entry is the gossip state of one key: this node's cumulative counters
// and what each peer last reported.
//
// It takes two cache lines, 128 bytes (a size the allocator aligns to
// 128): the first holds what every decision and look-up reads and hardly
// anything writes, the second what admissions (and pins) write. Cores
// admitting on one key then move one line of the entry between them, not
// two, and never the line they read.
type entry struct {
	// Read by decisions; written once a round at most (full: once a
	// round, or once each time the spend-capped share runs out).
	changed atomic.Int64 // round of the last Tick before the counters last changed
	born    atomic.Int64 // time of the first local request (ns): identifies the counter; 0 before
	// With the spend cap and full published, where unmet stops counting
	// in the round (see Limiter.unmetMax); stored under mu before full.
	unmetMax atomic.Int64
	remote   *remoteRec // the peer records, a list; guarded by mu
	key      string     // set before the entry is published, then constant
	hash     uint64     // of key, under the table's seed; likewise
	// With the spend cap: before this instant (ns) this node's share of
	// the round is spent, if nothing but time changes. Stored under mu
	// by a denial, cleared by whatever else changes the share: a peer's
	// record or debit (under mu, after the debit), a change of members, a
	// new round. A clock stepped back finds it ahead and keeps denying
	// single units until then, much as the bucket itself does: its TAT is
	// then as far ahead.
	full atomic.Int64

	// Written by admissions (and, with the spend cap, denials below the
	// demand ceiling).
	bucket gcra.State   // the key's token bucket
	hits   atomic.Int64 // units admitted here, cumulative
	unmet  atomic.Int64 // with the spend cap, units asked for here and not admitted, cumulative, up to each round's ceiling; demand is hits + unmet
	pin    atomic.Int32 // uses in progress (see table.pin); below dropped once dropped
	seq    uint32       // where the last round that took it put it (see changes); Tick's
	mu     sync.Mutex   // guards remote and the fields below
	round  int64        // with the spend cap, the round of spent
	spent  int64        // with the spend cap, units admitted here in round
	cap    *spending    // with the spend cap, the rest of its state
}

// remoteRec is what a peer reported of one key: one of the list of its
// entry's records, guarded by the entry's mu. A list, not a map: it takes
// 144 bytes a peer, where a map of two took 256 bytes and a record 112
// more for each; a cluster has few members.
type remoteRec struct {
	id     string     // the peer's ID
	next   *remoteRec // the entry's next record
	inc    uint64
	born   int64
	hits   uint64
	d0, d1 uint64 // cumulative demand at sender rounds r0 < r1
	h0, h1 uint64 // cumulative hits at the same rounds
	r0, r1 uint64
	seen   int64 // receiver round when the counter was last received

	allow      int64 // units the sender may still report (the cap)
	allowRound int64 // sender round allow was last refilled to
	credit     int64 // sender round of the last restart's burst added to allow
}

func (e *entry) unpin() { e.pin.Add(-1) }

// sharesChanged marks e's shares, if any, to be computed again, and clears
// full: a change to the peer records may grow this node's quota, and so
// may a debit (made before the call), by rounding. Called with e.mu held.
func (e *entry) sharesChanged() {
	if e.cap != nil {
		e.cap.shares.members = nil
	}
	e.full.Store(0)
}

// pinned pins e unless it was dropped.
func (e *entry) pinned() bool {
	if e.pin.Add(1) > 0 {
		return true
	}
	e.pin.Add(-1)
	return false
}

// touch notes a decision at now in round t: the counter is born at its
// first, and changed in t.
// The first to move changed forward to t adds e to d, the changes the
// next round looks at.
func (e *entry) touch(now, t int64, d *dirty) {
	if e.born.Load() == 0 {
		e.born.CompareAndSwap(0, now)
	}
	if c := e.changed.Load(); c < t && e.changed.CompareAndSwap(c, t) {
		d.add(e)
	}
}

// tat returns the TAT of e's bucket.
func (e *entry) tat() int64 {
	tat, _ := e.bucket.Load()
	return tat
}

// noRemote reports whether e keeps no peer records.
func (e *entry) noRemote() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.remote == nil
}

// peerRec returns the record of the peer with ID id, nil if none. Called
// with e.mu held.
func (e *entry) peerRec(id string) *remoteRec {
	for r := e.remote; r != nil; r = r.next {
		if r.id == id {
			return r
		}
	}
	return nil
}

// setPeerRec makes nr the record of its peer in place of old, the peer's
// record (nil if none), and returns it. Called with e.mu held.
func (e *entry) setPeerRec(old, nr *remoteRec) *remoteRec {
	if old != nil {
		nr.next = old.next
		*old = *nr
		return old
	}
	nr.next = e.remote
	e.remote = nr
	return nr
}

// pruneRemote drops peer records not received since round before (their
// sender has dropped them, or left) and reports whether none are left.
func (e *entry) pruneRemote(before int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sharesChanged()
	for p := &e.remote; *p != nil; {
		if (*p).seen < before {
			*p = (*p).next
		} else {
			p = &(*p).next
		}
	}
	return e.remote == nil
}
