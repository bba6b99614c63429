// Package keyed is the concurrent key → state map that every keyed limiter
// in this module stores its per-key state in.
//
// Each shard (256 at the default size) is an open-addressing table whose
// slots hold the per-key states themselves: a decision on a key touches
// the key's slot and nothing else, a few dozen bytes (across two adjacent
// cache lines at worst). Reads take no
// lock: readers probe the table while writers, serialized by the shard's
// mutex, publish into it; the algorithm updates the state in its slot with
// atomics.
//
// A slot does not hold its key. It holds the key's 64-bit seeded hash
// (less two bits of bookkeeping) and a second, independently seeded 64-bit
// hash (less one bit): a look-up matches both. Two keys share one state
// only if both collide: with a million keys, a chance near 10^-26 (125
// bits), and keys chosen by an attacker who does not know the seeds fare
// no better. Sharing would only ever deny more, never admit more.
//
// Memory is bounded two ways:
//
//   - a key whose state is back to full is dropped (no accuracy is lost:
//     a fresh state is the same as a full one). Idle keys are found lazily,
//     a few slots per insert, and by Sweep or the optional sweeper;
//   - a hard cap (Settings.MaxKeys) on the keys of the whole map, counted
//     in one atomic: inserting past it evicts a key chosen by the CLOCK
//     approximation of least-recently-used, from the inserting key's
//     shard or, when that has none to give, from another shard whose lock
//     is free. Evicting a key that was not full forgets its state (or
//     leaves its debt, see SetDebts); Evictions counts those.
//
// Removal never races with a decision. The map retires a state (State.Retire
// marks it dead with the algorithm's own compare-and-swap of the exact word
// it judged) before it drops the key, and a decision that finds its state
// dead looks the key up again (Again). Growing or rebuilding a table moves
// every state to the new table the same way: State.Move marks the old one
// dead as it copies it. A state is judged idle against a clock reading
// taken after its word was loaded (Judge.Now), so a word written by a
// decision that read the clock later than the clean-up is never judged
// from the past. And each shard records the latest instant its clean-up
// judged from: a decision whose own clock reading is older is lifted to that
// instant when it looks its key up (Get), so one held up between its clock
// reading and its look-up cannot count in a fresh state "before" the
// instant at which the dropped one was judged idle.
package keyed

import (
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/limiterkit"
)

// Retirer is what the map asks of a state about dropping it.
type Retirer interface {
	// Retire atomically marks the state dead if it is back to full, or,
	// when force is set, unconditionally (the map is evicting it). It
	// reports whether the state is now dead. Fullness is judged at
	// j.Now(), read after loading the state's word, and the word judged is
	// the one replaced (by compare-and-swap: if it changed, judge again).
	// A state may refuse a forced retirement (return false) when dropping
	// it would be wrong, such as slots still held; the map then looks for
	// another victim.
	Retire(j Judge, force bool) bool
}

// State is implemented by P, a pointer to an algorithm's per-key state,
// which the map keeps inline in its table slots. The zero value of the
// state must mean "fresh, full capacity". A state that must not move (it
// holds a lock or waiters) is kept in a Box.
type State[P any] interface {
	Retirer
	// Move marks the state dead, as Retire does, and copies what it held
	// into dst, a zero state that nobody else sees yet. The map moves
	// every live state when it rebuilds a table, under the shard's lock;
	// decisions that find the old state dead look the key up again.
	Move(dst P)
}

// Debtor is implemented by a state that leaves its debt behind when the
// MaxKeys cap evicts it, so that the key (or one that collides with it)
// does not come back fresh: the gubernator #98 bypass.
type Debtor interface {
	// Evict marks the state dead unconditionally and returns the word it
	// replaced: its debt, 0 for none. A dead state returns 0.
	Evict() int64
}

// Debts is the algorithm side of the debt table; see Map.SetDebts.
type Debts[P any] interface {
	// Merge returns a debt at least as strict as each of a and b.
	Merge(a, b int64) int64
	// Paid reports whether debt d is paid at now (the state would be full).
	Paid(d, now int64) bool
	// Owe makes the fresh state p owe d.
	Owe(p P, d int64)
}

// debtCell is one cell of the debt table: a debt and the fingerprint of
// the key that left it, or merged when several keys did.
type debtCell struct {
	fp   uint32
	debt int64
}

const merged = 1 // the fingerprint of a cell merged from several keys

// Judge is the clock a State's Retire judges idleness by.
type Judge interface {
	// Now returns the current time in nanoseconds since the Unix epoch.
	Now() int64
}

// At is a Judge that always reads the same instant: for tests.
type At int64

// Now returns a.
func (a At) Now() int64 { return int64(a) }

// A slot's tag is 0 while the slot is empty, gone once its key was
// dropped, and otherwise the key's hash with the live bit set and the
// reference bit (CLOCK's) set by look-ups. A slot is never reused while
// its table is in use: a decision may still hold its state.
const (
	refBit  = 1
	liveBit = 2
	gone    = 4 // not live, not empty
)

// tagOf returns the live tag of a key of hash h, reference bit clear.
func tagOf(h uint64) uint64 { return h&^(refBit|liveBit) | liveBit }

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
		if got&^refBit == tag {
			if want == 0 {
				want = idOf(ids, key)
			}
			if sl.id == want {
				if got&refBit == 0 {
					sl.tag.Or(refBit)
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

type shard[S any] struct {
	tab    atomic.Pointer[table[S]]
	judged atomic.Int64 // latest instant a clean-up of this shard judged from
	clk    *clock.Source
	keys   *atomic.Int64 // the map's key count
	mu     sync.Mutex    // serializes writers: tab's contents, n, hands
	n      int           // live keys
	hand   int           // eviction hand, a slot index
	sweep  int           // idle-sweep hand, a slot index
	_      [64]byte
}

// Map maps keys to per-key states of type S, which *S manages through the
// State interface. It is safe for concurrent use. Create it with New.
type Map[S any, P interface {
	*S
	State[P]
}] struct {
	clk       clock.Source
	set       limiterkit.Settings
	seed      maphash.Seed
	ids       uint64 // idOf's seed
	shards    []shard[S]
	mask      uint64
	cold      atomic.Bool   // the tables have outgrown the caches near a core: see GetNow
	coldAt    int           // a shard's table of this many slots makes the map cold
	keys      atomic.Int64  // live keys in all shards
	next      atomic.Uint32 // where eviction from other shards starts
	evictions atomic.Uint64
	debts     Debts[P]
	debtMu    sync.Mutex
	table     []debtCell  // allocated at the first eviction with a debt
	hasDebts  atomic.Bool // table is allocated
	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// New returns an empty Map bounded by s.MaxKeys, reading time from
// s.Clock. If s.SweepInterval is positive a sweeper goroutine runs until
// Close.
func New[S any, P interface {
	*S
	State[P]
}](s limiterkit.Settings) *Map[S, P] {
	n := 1
	for n < maxShards && n*2*64 <= s.MaxKeys {
		n *= 2
	}
	m := &Map[S, P]{
		clk:    clock.New(s.Clock),
		set:    s,
		seed:   maphash.MakeSeed(),
		ids:    rand.Uint64(),
		shards: make([]shard[S], n),
		mask:   uint64(n - 1),
	}
	m.coldAt = max(coldBytes/(n*int(unsafe.Sizeof(slot[S]{}))), 1)
	for i := range m.shards {
		m.shards[i].tab.Store(newTable[S](minTable))
		m.shards[i].judged.Store(math.MinInt64) // nothing judged yet: lifts no reading, before 1970 too
		m.shards[i].clk = &m.clk
		m.shards[i].keys = &m.keys
	}
	if s.SweepInterval > 0 {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.sweeper(s.SweepInterval)
	}
	return m
}

// A map whose tables take coldBytes or more in all is cold: a key's slot
// is then likely out of the caches near a core (a core's L2 holds 0.5 to
// 2 MiB on current servers). cacheLine is the size of a cache line.
const (
	coldBytes = 1 << 20
	cacheLine = 64
)

// maxShards bounds the number of shards: enough that writers on distinct
// keys rarely meet on two cores or many. minTable is a table's least size.
const (
	maxShards = 256
	minTable  = 8
)

// SetDebts turns on the debt table: states evicted by the MaxKeys cap
// while owing (their Evict word is not 0) leave their debt in a table of
// 2·MaxKeys cells indexed by key hash, allocated at the first such
// eviction; a new key starts from its own cell's debt, or from a cell that
// several keys' debts were merged into. A cell is cleared once its debt is
// paid. It must be called before the map is used, and only if P
// implements Debtor.
func (m *Map[S, P]) SetDebts(d Debts[P]) { m.debts = d }

// debtHash returns the hash the debt table files the key of tag under:
// its bits above the shard's.
func debtHash(tag uint64) uint64 { return tag >> 8 }

func fingerprint(h uint64) uint32 { return uint32(h>>32) | 2 }

// cells returns the two cells of hash h; m.debtMu must be held.
func (m *Map[S, P]) cells(h uint64) (*debtCell, *debtCell) {
	mask := uint64(len(m.table) - 1)
	return &m.table[h&mask], &m.table[(h>>20)&mask]
}

// leave records debt d of the key of hash h.
func (m *Map[S, P]) leave(h uint64, d int64, now int64) {
	m.debtMu.Lock()
	defer m.debtMu.Unlock()
	if m.table == nil {
		size := 2
		for size < 2*m.set.MaxKeys {
			size *= 2
		}
		m.table = make([]debtCell, size)
		m.hasDebts.Store(true)
	}
	fp := fingerprint(h)
	a, b := m.cells(h)
	for _, c := range [2]*debtCell{a, b} {
		if c.debt != 0 && m.debts.Paid(c.debt, now) {
			*c = debtCell{}
		}
	}
	switch {
	case a.fp == fp:
		a.debt = m.debts.Merge(a.debt, d)
	case b.fp == fp:
		b.debt = m.debts.Merge(b.debt, d)
	case a.debt == 0:
		*a = debtCell{fp, d}
	case b.debt == 0:
		*b = debtCell{fp, d}
	default: // both taken by others: merge into the first
		*a = debtCell{merged, m.debts.Merge(a.debt, d)}
	}
}

// owed returns the debt a new key of hash h starts from (0 for none),
// taking its own cell's debt out of the table.
func (m *Map[S, P]) owed(h uint64, now int64) int64 {
	m.debtMu.Lock()
	defer m.debtMu.Unlock()
	if m.table == nil {
		return 0
	}
	fp := fingerprint(h)
	a, b := m.cells(h)
	var d int64
	for _, c := range [2]*debtCell{a, b} {
		switch {
		case c.debt == 0:
		case m.debts.Paid(c.debt, now):
			*c = debtCell{}
		case c.fp == fp:
			d = merge(m.debts, d, c.debt)
			*c = debtCell{}
		case c.fp == merged:
			d = merge(m.debts, d, c.debt)
		}
	}
	return d
}

func merge[P any](ds Debts[P], a, b int64) int64 {
	if a == 0 {
		return b
	}
	return ds.Merge(a, b)
}

// Now reads the map's clock, in nanoseconds since the Unix epoch.
func (m *Map[S, P]) Now() int64 { return m.clk.Now() }

// locate returns key's shard and live tag.
func (m *Map[S, P]) locate(key string) (*shard[S], uint64) {
	h := maphash.String(m.seed, key)
	return &m.shards[h&m.mask], tagOf(h)
}

// idOf returns key's second hash, the one a slot keeps to tell keys
// apart; never 0, which find takes for "not computed yet". It is a seeded
// multiply-fold over the key's 8-byte words, a third of maphash's cost
// on short keys: it only has to tell apart keys whose maphash already
// matched.
func idOf(seed uint64, key string) uint64 {
	h := seed ^ uint64(len(key))*k0
	for len(key) > 8 {
		h = fold(h^word(key), k1)
		key = key[8:]
	}
	var t uint64 // the last 1 to 8 bytes
	for i := len(key) - 1; i >= 0; i-- {
		t = t<<8 | uint64(key[i])
	}
	return fold(fold(h^t, k2), k3) | 1
}

// Odd constants with well-mixed bits, for idOf.
const (
	k0 = 0xa0761d6478bd642f
	k1 = 0xe7037ed1a0b428db
	k2 = 0x8ebc6af09c88c6e3
	k3 = 0x589965cc75374cc3
)

// fold returns the high and low halves of a·b folded together.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// word returns the first 8 bytes of s, little-endian.
func word(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// Now reads the clock for a clean-up of sh and records the reading as the
// shard's latest judged instant; sh.mu must be held. It implements Judge.
func (sh *shard[S]) Now() int64 {
	t := sh.clk.Now()
	if t > sh.judged.Load() {
		sh.judged.Store(t)
	}
	return t
}

// Get returns the state of key, inserting a fresh zero state if the key is
// absent, and the instant the caller must decide at: now, the caller's
// clock reading, or the later instant a clean-up of the key's shard judged
// a state idle at. The state may be retired or moved concurrently at any
// time; the caller then calls Again with the instant it got.
func (m *Map[S, P]) Get(key string, now int64) (P, int64) {
	sh, tag := m.locate(key)
	return m.get(sh, tag, key, now)
}

// GetNow is Get at the current time, the clock read once. The key is
// hashed first: hashing then overlaps the clock's read, which waits for
// the loads before it to complete. Once the tables have outgrown the
// caches near a core (cold), the key's home slot is also prefetched
// before the clock is read: the clock's read waits for earlier loads to
// complete (lfence or rdtscp on amd64), not for a prefetch, so the slot's
// cache miss and the clock's read take their time together instead of one
// after the other. A map small enough to stay in cache skips the
// prefetch, which there would only cost a call.
func (m *Map[S, P]) GetNow(key string) (P, int64) {
	sh, tag := m.locate(key)
	if m.cold.Load() {
		t := sh.tab.Load()
		sl := &t.slots[t.home(tag)]
		prefetch(unsafe.Pointer(sl))
		if unsafe.Sizeof(*sl) > cacheLine { // the sliding log's pair of lines
			prefetch(unsafe.Add(unsafe.Pointer(sl), cacheLine))
		}
	}
	return m.get(sh, tag, key, m.clk.Now())
}

// get is Get once the key is located.
func (m *Map[S, P]) get(sh *shard[S], tag uint64, key string, now int64) (P, int64) {
	var p P
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		p = &sl.state
	} else {
		p = m.insert(sh, tag, key)
	}
	if j := sh.judged.Load(); j > now {
		now = j
	}
	return p, now
}

// Again is Get for a caller whose state turned out dead: it first waits
// for the writer of key's shard, which may be moving the shard's states to
// a new table, so that the caller does not spin on the moved state.
func (m *Map[S, P]) Again(key string, now int64) (P, int64) {
	m.wait(key)
	return m.Get(key, now)
}

// LoadAgain is Load for a caller whose state turned out dead, as Again.
func (m *Map[S, P]) LoadAgain(key string) P {
	m.wait(key)
	return m.Load(key)
}

// wait waits for the writer of key's shard, if any.
func (m *Map[S, P]) wait(key string) {
	sh, _ := m.locate(key)
	sh.mu.Lock()
	//lint:ignore SA2001 an empty critical section: waiting for the writer is the point
	sh.mu.Unlock()
}

// Begin does what every keyed decision does first: it checks that the map
// is open, the key, and n against limit (see limiterkit.CheckN), reads the
// clock once, and returns key's state and the instant to decide at (see
// Get). If the state turns out dead, the caller calls Again(key, now).
func (m *Map[S, P]) Begin(key string, n, limit int) (P, int64, error) {
	if err := m.Check(key); err != nil {
		return nil, 0, err
	}
	if n <= 0 || n > limit {
		return nil, 0, limiterkit.CheckN(n, limit)
	}
	p, now := m.GetNow(key)
	return p, now, nil
}

// Decide is a keyed decision whole: Begin, then step on key's state
// until step finds it live, taking the state again (Again) each time it
// was dead. step reports whether the state was live, and the decision's
// error; it must decide nothing on a dead state. Errors are Begin's or
// step's.
func (m *Map[S, P]) Decide(key string, n, limit int, step func(s P, now int64) (live bool, err error)) error {
	s, now, err := m.Begin(key, n, limit)
	if err != nil {
		return err
	}
	return m.Retry(key, s, now, step)
}

// Retry calls step on s at now, then, while step finds the state dead,
// on key's state taken again (Again); it returns step's error.
func (m *Map[S, P]) Retry(key string, s P, now int64, step func(s P, now int64) (live bool, err error)) error {
	for {
		if live, err := step(s, now); live {
			return err
		}
		s, now = m.Again(key, now)
	}
}

// Load returns the state of key, or nil if the key is absent.
func (m *Map[S, P]) Load(key string) P {
	sh, tag := m.locate(key)
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		return &sl.state
	}
	return nil
}

// filler is implemented by a state that must be set up before its key is
// published (Box).
type filler interface{ fill() }

func (m *Map[S, P]) insert(sh *shard[S], tag uint64, key string) P {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		return &sl.state
	}
	m.sweepSome(sh, sweepLook)
	if m.keys.Load() >= int64(m.set.MaxKeys) && !m.evictOne(sh) {
		m.evictElsewhere(sh)
	}
	sl := m.room(sh).claim(tag)
	sl.id = idOf(m.ids, key)
	p := P(&sl.state)
	if f, ok := any(p).(filler); ok {
		f.fill()
	}
	if m.debts != nil && m.hasDebts.Load() {
		if d := m.owed(debtHash(tag), sh.Now()); d != 0 {
			m.debts.Owe(p, d)
		}
	}
	// A new key starts referenced: wherever its slot lies ahead of the
	// eviction hand, it lives at least one turn of the hand.
	sl.tag.Store(tag | refBit)
	sh.n++
	sh.keys.Add(1)
	return p
}

// room returns sh's table with room for one more key, rebuilding it first
// when live and gone slots would pass three quarters of it: the new table
// is twice the live keys, so that it stays between half and three
// quarters full, and every live state moves to it. sh.mu must be held.
func (m *Map[S, P]) room(sh *shard[S]) *table[S] {
	if t := sh.tab.Load(); 4*(t.used+1) <= 3*len(t.slots) {
		return t
	}
	return m.rebuild(sh)
}

// rebuild replaces sh's table by one of twice its live keys (plus one),
// moving every live state to it; sh.mu must be held.
func (m *Map[S, P]) rebuild(sh *shard[S]) *table[S] {
	t := sh.tab.Load()
	nt := newTable[S](max(minTable, 2*(sh.n+1)))
	for i := range t.slots {
		sl := &t.slots[i]
		tag := sl.tag.Load()
		if tag&liveBit == 0 {
			continue
		}
		to := nt.claim(tag &^ refBit)
		to.id = sl.id
		P(&sl.state).Move(&to.state)
		to.tag.Store(tag)
	}
	sh.tab.Store(nt) // readers of t find the moved states dead and look again
	// Shards hold about as many keys each, so this table's size stands
	// for all of them; cold is a hint, and only ever costs or saves time.
	if c := len(nt.slots) >= m.coldAt; c != m.cold.Load() {
		m.cold.Store(c)
	}
	sh.hand, sh.sweep = 0, 0
	return nt
}

// remove drops the key of sl, a live slot of sh's table; sh.mu must be
// held and sl's state dead.
func (sh *shard[S]) remove(sl *slot[S]) {
	sl.tag.Store(gone)
	sh.n--
	sh.keys.Add(-1)
}

// sweepLook is how many slots an insert examines for idle states.
const sweepLook = 4

// sweepSome examines up to k slots of sh's table for idle states; sh.mu
// must be held.
func (m *Map[S, P]) sweepSome(sh *shard[S], k int) {
	t := sh.tab.Load()
	for ; k > 0; k-- {
		if sh.sweep++; sh.sweep >= len(t.slots) {
			sh.sweep = 0
		}
		sl := &t.slots[sh.sweep]
		if sl.tag.Load()&liveBit != 0 && P(&sl.state).Retire(sh, false) {
			sh.remove(sl)
		}
	}
}

// evictElsewhere evicts one key from a shard other than own whose lock it
// can take without waiting; own.mu is held. If none gives one, the map
// grows past its cap (a soft cap, so that slots held by a concurrency
// limiter are never forgotten, and an insert never waits on a second lock).
func (m *Map[S, P]) evictElsewhere(own *shard[S]) {
	start := int(m.next.Add(1))
	for i := range min(len(m.shards), evictTries) {
		o := &m.shards[(start+i)&int(m.mask)]
		if o == own || !o.mu.TryLock() {
			continue
		}
		ok := m.evictOne(o)
		o.mu.Unlock()
		if ok {
			return
		}
	}
}

// evictTries bounds how many other shards one insert asks to evict, and
// evictLook how many states may refuse in each.
const (
	evictTries = 4
	evictLook  = 64
)

// evictOne frees one key of sh by the CLOCK policy and reports whether it
// did; sh.mu must be held. It fails when every state refuses.
func (m *Map[S, P]) evictOne(sh *shard[S]) bool {
	// Two turns of the hand find a victim unless every key was used
	// again meanwhile: the first turn clears the reference bits it passes
	// (each cleared bit paid for by the look-up that set it). The hand
	// resumes where it stopped, and at most evictLook states may refuse,
	// so the look costs O(1) per insert even when most states refuse
	// (units held by counting): such a map grows past its cap a little
	// instead of scanning every key.
	t := sh.tab.Load()
	refused := 0
	for range 2 * len(t.slots) {
		if sh.hand++; sh.hand >= len(t.slots) {
			sh.hand = 0
		}
		sl := &t.slots[sh.hand]
		tag := sl.tag.Load()
		p := P(&sl.state)
		switch {
		case tag&liveBit == 0:
			continue
		case tag&refBit != 0:
			sl.tag.And(^uint64(refBit))
			continue
		case refused == evictLook:
			return false
		case p.Retire(sh, false):
		case m.debts != nil:
			if d := any(p).(Debtor).Evict(); d != 0 {
				m.evictions.Add(1)
				m.leave(debtHash(tag), d, sh.Now())
			}
		case p.Retire(sh, true):
			m.evictions.Add(1)
		default:
			refused++
			continue
		}
		sh.remove(sl)
		return true
	}
	return false
}

// Sweep drops every key whose state is full and returns how many it
// dropped. A table left less than an eighth full is rebuilt smaller.
func (m *Map[S, P]) Sweep() int {
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		t := sh.tab.Load()
		for sl := range t.live {
			if P(&sl.state).Retire(sh, false) {
				sh.remove(sl)
				dropped++
			}
		}
		if len(t.slots) > minTable && 8*sh.n < len(t.slots) {
			m.rebuild(sh) // give back the memory of a flood that has passed
		}
		sh.mu.Unlock()
	}
	return dropped
}

// Len returns the number of keys held.
func (m *Map[S, P]) Len() int { return int(m.keys.Load()) }

// Evictions returns how many keys were evicted by the MaxKeys cap while
// their state was not full.
func (m *Map[S, P]) Evictions() uint64 { return m.evictions.Load() }

// Range calls f for each key's state until f returns false. f runs under
// a shard's lock: it must not call into the Map.
func (m *Map[S, P]) Range(f func(p P) bool) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for sl := range sh.tab.Load().live {
			if !f(&sl.state) {
				sh.mu.Unlock()
				return
			}
		}
		sh.mu.Unlock()
	}
}

// Check returns an error wrapping throttle.ErrClosed after Close, or the
// error of Settings.CheckKey for a bad key: the checks every keyed limiter
// makes before a decision.
func (m *Map[S, P]) Check(key string) error {
	if m.closed.Load() {
		return throttle.ErrClosed
	}
	if key != "" && len(key) <= m.set.MaxKeyLen {
		return nil // the common case, inlined
	}
	return m.set.CheckKey(key)
}

// Closed reports whether Close was called.
func (m *Map[S, P]) Closed() bool { return m.closed.Load() }

// Close marks the map closed and stops the sweeper, waiting for it. It is
// idempotent and always returns nil.
func (m *Map[S, P]) Close() error {
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
	})
	return nil
}

func (m *Map[S, P]) sweeper(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Box keeps a state that must not move (it holds a lock or waiters) on the
// heap, allocated when its key is inserted; the map's slot holds the
// pointer, and moving the slot moves the pointer. Box implements State by
// delegating to the boxed state, and Debtor when Q does.
type Box[T any, Q interface {
	*T
	Retirer
}] struct{ p *T }

// State returns the boxed state.
func (b *Box[T, Q]) State() Q { return b.p }

func (b *Box[T, Q]) fill() { b.p = new(T) }

// Retire implements Retirer by asking the boxed state.
func (b *Box[T, Q]) Retire(j Judge, force bool) bool { return Q(b.p).Retire(j, force) }

// Move implements State: the boxed state itself stays where it is.
func (b *Box[T, Q]) Move(dst *Box[T, Q]) { dst.p = b.p }

// Evict implements Debtor by asking the boxed state, which must implement
// it.
func (b *Box[T, Q]) Evict() int64 { return any(Q(b.p)).(Debtor).Evict() }
