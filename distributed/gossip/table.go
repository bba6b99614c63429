package gossip

import (
	"hash/maphash"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// table maps keys to entries. It is an open-addressing hash table with
// linear probing whose slots point to the entries; an entry holds its key
// and hash, on the line a decision reads anyway, so a look-up touches the
// slot and that line. Decisions look keys up without a lock. Inserts and
// drops take mu, so that the count stays exact; a drop leaves a tombstone
// so that probes continue past it. When live and dead slots would pass
// three quarters of the slots, an insert rebuilds the table at twice the
// live keys and publishes it whole: a reader of the old table that misses a
// key looks again under mu (pin), and one that finds a dropped entry fails
// to pin it and looks again.
type table struct {
	max   int
	seed  maphash.Seed
	n     atomic.Int64 // keys, the overflow key aside
	mu    sync.Mutex   // serializes inserts, drops and rebuilds
	slots atomic.Pointer[slots]
}

// slots is one generation of the table. Every look-up reads it, so it
// fills a cache line of its own (64 bytes, a size the allocator aligns
// to 64): a small object that another core writes often, allocated next
// to it, would otherwise slow every decision down.
type slots struct {
	s    []atomic.Pointer[entry] // a power of two of them
	used int                     // live and dead slots; guarded by table.mu
	_    [32]byte
}

// tombstone marks the slot of a dropped key.
var tombstone = &entry{}

const minSlots = 16

func (t *table) init(max int) {
	t.max = max
	t.seed = maphash.MakeSeed()
	t.slots.Store(&slots{s: make([]atomic.Pointer[entry], minSlots)})
}

// full reports whether the table holds its most keys (the overflow key
// aside): a new key then goes under the overflow key.
func (t *table) full() bool { return t.n.Load() >= int64(t.max) }

// load returns the entry of key, or nil.
func (t *table) load(key string) *entry {
	s := t.slots.Load()
	h := maphash.String(t.seed, key)
	mask := uint64(len(s.s) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := s.s[i].Load()
		if e == nil {
			return nil
		}
		if e.hash == h && e.key == key && e != tombstone {
			return e
		}
	}
}

// insert adds a new entry for key, which the table does not hold, and
// returns it; t.mu is held. The entry keeps a copy of key, so that it
// does not keep alive whatever the caller's string points into.
func (t *table) insert(key string) *entry {
	s := t.slots.Load()
	if 4*(s.used+1) > 3*len(s.s) {
		s = t.rebuild(s)
	}
	e := &entry{key: key, hash: maphash.String(t.seed, key)}
	e.changed.Store(math.MinInt64 / 2)
	s.put(e)
	return e
}

// put stores e in the first empty slot of its probe sequence; the table's
// mu is held and s has room.
func (s *slots) put(e *entry) {
	mask := uint64(len(s.s) - 1)
	i := e.hash & mask
	for s.s[i].Load() != nil {
		i = (i + 1) & mask
	}
	s.s[i].Store(e)
	s.used++
}

// rebuild publishes a table holding the live entries of s, with at least
// twice as many slots (a power of two, so between a quarter and half
// full), and returns it; t.mu is held.
func (t *table) rebuild(s *slots) *slots {
	live := 0
	for i := range s.s {
		if e := s.s[i].Load(); e != nil && e != tombstone {
			live++
		}
	}
	size := minSlots
	for size < 2*(live+1) {
		size *= 2
	}
	ns := &slots{s: make([]atomic.Pointer[entry], size)}
	for i := range s.s {
		if e := s.s[i].Load(); e != nil && e != tombstone {
			ns.put(e)
		}
	}
	t.slots.Store(ns)
	return ns
}

// remove replaces e's slot by a tombstone and reports whether e was in
// the table; t.mu is held.
func (t *table) remove(e *entry) bool {
	s := t.slots.Load()
	mask := uint64(len(s.s) - 1)
	for i := e.hash & mask; ; i = (i + 1) & mask {
		switch s.s[i].Load() {
		case nil:
			return false
		case e:
			s.s[i].Store(tombstone)
			return true
		}
	}
}

// each calls f for every entry of the table as it was when each began
// (entries dropped meanwhile included).
func (t *table) each(f func(string, *entry)) {
	s := t.slots.Load()
	for i := range s.s {
		if e := s.s[i].Load(); e != nil && e != tombstone {
			f(e.key, e)
		}
	}
}

// sweep calls f for the live entries of 1/parts of the slots, starting at
// slot from, and returns the slot the next sweep starts at.
func (t *table) sweep(from, parts int, f func(string, *entry)) int {
	s := t.slots.Load()
	n := (len(s.s) + parts - 1) / parts
	if from >= len(s.s) {
		from = 0 // the table was rebuilt smaller meanwhile
	}
	end := min(from+n, len(s.s))
	for i := from; i < end; i++ {
		if e := s.s[i].Load(); e != nil && e != tombstone {
			f(e.key, e)
		}
	}
	if end == len(s.s) {
		return 0
	}
	return end
}

// pin returns key's entry, created if absent, pinned so that it is not
// dropped until unpin. It returns nil when the table is full.
func (t *table) pin(key string) *entry {
	for {
		e := t.load(key)
		if e == nil {
			if t.full() && key != OverflowKey {
				return nil // the overflow key always has room
			}
			t.mu.Lock()
			if e = t.load(key); e == nil {
				e = t.insert(key)
				if key != OverflowKey {
					t.n.Add(1) // the overflow key is beyond the count
				}
			}
			t.mu.Unlock()
		}
		if e.pinned() {
			return e
		}
	}
}

// kept reports whether e, which a decision touched (see entry.touch) and
// counted on, is kept: not dropped, or dropped and put back by a round that
// saw the touch. It is false when e was dropped by a round that did not
// see it, and the counts are lost with it. Touch first, then read pin;
// drop writes pin first, then reads changed: one of the two sees the
// other's write.
func (t *table) kept(key string, e *entry) bool {
	for e.pin.Load() < 0 {
		if t.load(key) != e {
			return false
		}
		runtime.Gosched() // the drop is deciding
	}
	return true
}

// get returns key's entry, created if absent, not pinned: it may be
// dropped at any time. It returns nil when the table is full.
func (t *table) get(key string) *entry {
	if e := t.load(key); e != nil {
		return e
	}
	e := t.pin(key)
	if e != nil {
		e.unpin()
	}
	return e
}

// dropped is an entry's pin count once dropped: a pin is one add, not a
// compare-and-swap loop, so that a hot key's decisions do not retry each
// other's pins, and the pins that find a dropped entry (and take their add
// back) cannot bring it back to zero.
const dropped = math.MinInt32 / 2

// drop removes e if no decision holds it and, once none can pin it, still
// it still is.
func (t *table) drop(key string, e *entry, still func() bool) {
	if !e.pin.CompareAndSwap(0, dropped) {
		return
	}
	if !still() {
		e.pin.Add(-dropped) // back to the pins that failed meanwhile and will take theirs back
		return
	}
	t.mu.Lock()
	if t.remove(e) && key != OverflowKey {
		t.n.Add(-1)
	}
	t.mu.Unlock()
}
