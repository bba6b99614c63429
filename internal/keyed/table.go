package keyed

import (
	"math/bits"
	"sync/atomic"
)

// A shard's open-addressing table: its slots, their tags, and probing.

// A slot's tag is 0 while the slot is empty, gone once its key was
// dropped, and otherwise the key's hash with the live bit set and CLOCK's
// two reference bits: refBit, set when the key is inserted and by every
// look-up, and againBit, set by a look-up, so that a key used again since
// the eviction hand last passed it survives two passes of the hand and a
// key used once (a fresh key, a scan of one-off keys) survives one. A slot
// is never reused while its table is in use: a decision may still hold
// its state.
const (
	refBit   = 1
	liveBit  = 2
	againBit = 4
	gone     = 4 // not live, not empty
	refBits  = refBit | againBit
)

// tagOf returns the live tag of a key of hash h, reference bits clear.
func tagOf(h uint64) uint64 { return h&^(refBits|liveBit) | liveBit }

// slot is one cell of a table. id and state are written before tag is
// published and id never changes after, so a reader that loaded a live tag
// may read id and decide on state.
type slot[S any] struct {
	tag   atomic.Uint64
	id    uint64 // the key's second hash
	state S
}

// table is a shard's open-addressing hash table with linear probing.
// Readers load slots without locking; only the shard's writer changes
// them. A dropped key leaves its slot gone, so that probes continue past
// it; a table is rebuilt (and swapped in whole) when live and gone slots
// fill three quarters of it.
type table[S any] struct {
	slots []slot[S]
	used  int // live and gone slots; guarded by the shard's mu
}

func newTable[S any](size int) *table[S] { return &table[S]{slots: make([]slot[S], size)} }

// live yields the slots of t that hold a key; the shard's mu must be held.
func (t *table[S]) live(yield func(*slot[S]) bool) {
	for i := range t.slots {
		if sl := &t.slots[i]; sl.tag.Load()&liveBit != 0 && !yield(sl) {
			return
		}
	}
}

// home returns the first slot of tag's probe sequence: the high bits of
// the hash scaled to the table's length (the low bits chose the shard).
func (t *table[S]) home(tag uint64) int {
	hi, _ := bits.Mul64(tag, uint64(len(t.slots)))
	return int(hi)
}

// find returns the slot of key, whose live tag is tag and whose second
// hash (computed once, on the first tag that matches) is seeded by ids,
// or nil.
func (t *table[S]) find(tag uint64, key string, ids uint64) *slot[S] {
	var want uint64
	for i := t.home(tag); ; {
		sl := &t.slots[i]
		got := sl.tag.Load()
		if got == 0 {
			return nil
		}
		if got&^refBits == tag {
			if want == 0 {
				want = idOf(ids, key)
			}
			if sl.id == want {
				if got&refBits != refBits {
					sl.tag.Or(refBits)
				}
				return sl
			}
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// claim returns the first empty slot of tag's probe sequence; the
// writer's lock must be held and the table must have room.
func (t *table[S]) claim(tag uint64) *slot[S] {
	i := t.home(tag)
	for t.slots[i].tag.Load() != 0 {
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	t.used++
	return &t.slots[i]
}
