package gossip

import (
	"hash/maphash"
	"math"
	"sync"
)

// untrackedSlots is how many peer counters of keys a full table has no
// room for a limiter remembers: a fixed array, allocated when the table
// first has no room for a reported key.
const untrackedSlots = 4096

// untracked is what a limiter whose table is full remembers of its peers'
// counters of keys it has no room for: the last value seen of each, in a
// fixed array indexed by a hash of sender and key (a slot taken by
// another counter forgets the one it held). Reports are cumulative and
// sent again; the growth over the value remembered is charged to the
// overflow bucket, under which this node decides those keys. The zero
// value is ready; safe for concurrent use.
type untracked struct {
	mu    sync.Mutex
	seed  maphash.Seed
	slots []untrackedSlot
}

type untrackedSlot struct {
	h    uint64 // of sender and key; 0 if free
	born int64
	hits uint64
}

// growth records x, sender's report of a key this node does not hold,
// and returns the units it adds: its growth over the value remembered,
// or all of it for a counter not remembered that was born after this node
// started listening to the sender (acceptFrom), as for a tracked key. A
// counter forgotten (its slot taken) and seen again is charged again in
// full: more than it admitted, never less.
func (u *untracked) growth(sender string, x reportEntry, acceptFrom int64) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.slots == nil {
		u.seed, u.slots = maphash.MakeSeed(), make([]untrackedSlot, untrackedSlots)
	}
	var mh maphash.Hash
	mh.SetSeed(u.seed)
	mh.WriteString(sender)
	mh.WriteByte(0)
	mh.WriteString(x.key)
	h := mh.Sum64() | 1
	s := &u.slots[h%untrackedSlots]
	switch {
	case s.h == h && x.born == s.born:
		if x.hits <= s.hits {
			return 0
		}
		d := x.hits - s.hits
		s.hits = x.hits
		return int64(min(d, math.MaxInt64))
	case s.h == h && x.born < s.born:
		return 0 // an older counter, delayed
	}
	*s = untrackedSlot{h: h, born: x.born, hits: x.hits}
	if x.born < acceptFrom {
		return 0 // history: the baseline
	}
	return int64(min(x.hits, math.MaxInt64))
}

// chargeUntracked debits the overflow bucket, at now, with the growth of
// x, a report of m's sender of a key the full table has no room for, up
// to what the sender could have admitted of it (see applyReport), and
// never below what the reports of every member could take a full bucket
// to (see applyState). It returns the units debited and those not.
func (l *Limiter) chargeUntracked(m *message, x reportEntry, acceptFrom, sr, now int64) (debited, capped int64) {
	delta := l.untracked.growth(m.sender, x, acceptFrom)
	if delta <= 0 {
		return 0, 0
	}
	if most := l.allowance(sr - max(x.born, acceptFrom)/l.node.interval); delta > most {
		delta, capped = most, delta-most
	}
	e := l.table.pin(OverflowKey)
	defer e.unpin()
	e.mu.Lock()
	defer e.mu.Unlock()
	floor := -l.node.size.Load() * l.allowance(0)
	if room := l.bucket.Tokens(now, e.tat()) - floor; delta > room {
		delta, capped = max(room, 0), satAdd(capped, delta-max(room, 0))
	}
	if delta > 0 {
		e.bucket.Debit(now, l.bucket.Cost(delta))
		e.sharesChanged()
	}
	return delta, capped
}
