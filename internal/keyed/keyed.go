// Package keyed is the concurrent key → state map that every keyed limiter
// in this module stores its per-key state in.
//
// Reads take no lock: each shard (256 at the default size) is an
// open-addressing table of atomic pointers that readers probe while writers,
// serialized by the shard's mutex, publish into it; the per-key state is
// updated by the algorithm with atomics. Memory is bounded two ways:
//
//   - a key whose state is back to full is dropped (no accuracy is lost:
//     a fresh state is the same as a full one). Idle keys are found lazily,
//     two ring slots per insert, and by Sweep or the optional sweeper;
//   - a hard cap (Settings.MaxKeys) on the keys of the whole map, counted
//     in one atomic: inserting past it evicts a key chosen by the CLOCK
//     approximation of least-recently-used, from the inserting key's
//     shard or, when that has none to give, from another shard whose lock
//     is free. Evicting a key
//     that was not full forgets its state; Evictions counts those.
//
// Removal never races with a decision. The map retires a state (State.Retire
// marks it dead with the algorithm's own compare-and-swap of the exact word
// it judged) before it drops the key, and a decision that finds its state
// dead looks the key up again. A state is judged idle against a clock
// reading taken after its word was loaded (Judge.Now), so a word written by
// a decision that read the clock later than the clean-up is never judged
// from the past. And each shard records the latest instant its clean-up
// judged from: a decision whose own clock reading is older is lifted to that
// instant when it looks its key up (Get), so one held up between its clock
// reading and its look-up cannot count in a fresh state "before" the
// instant at which the dropped one was judged idle.
package keyed

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/limiterkit"
)

// State is implemented by a pointer to an algorithm's per-key state. The
// zero value of the state must mean "fresh, full capacity".
type State interface {
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

// Debtor is implemented by a state that leaves its debt behind when the
// MaxKeys cap evicts it, so that the key (or one that collides with it)
// does not come back fresh: the gubernator #98 bypass.
type Debtor interface {
	State
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

// inlineKey is the longest key stored inside its entry. A lookup of such a
// key touches two cache lines at most: its table slot and its entry, which
// holds the state too when the state is small.
const inlineKey = 24

type entry[S any] struct {
	state S
	hash  uint64
	ref   atomic.Uint32 // CLOCK reference bit, set on access
	klen  uint32        // length of an inline key
	kbuf  [inlineKey]byte
	long  string // a key longer than inlineKey
}

func newEntry[S any](key string, h uint64) *entry[S] {
	e := &entry[S]{hash: h}
	if len(key) > inlineKey {
		e.long = strings.Clone(key)
	} else {
		e.klen = uint32(copy(e.kbuf[:], key))
	}
	return e
}

func (e *entry[S]) is(key string) bool {
	if len(key) > inlineKey {
		return e.long == key
	}
	return e.long == "" && int(e.klen) == len(key) && string(e.kbuf[:len(key)]) == key
}

func (e *entry[S]) key() string {
	if e.long != "" {
		return e.long
	}
	return string(e.kbuf[:e.klen])
}

// slot is one cell of a table. hash is written before e is published and
// never changes after, so a reader that loaded e may read it.
type slot[S any] struct {
	e    atomic.Pointer[entry[S]]
	hash uint64
}

// table is a shard's open-addressing hash table with linear probing.
// Readers load slots without locking; only the shard's writer changes
// them. A removed entry leaves a tombstone so that probes continue past it;
// a table is rebuilt (and swapped in whole) when live entries and
// tombstones fill three quarters of it.
type table[S any] struct {
	slots []slot[S]
	mask  uint64
	used  int // live entries + tombstones; guarded by the shard's mu
}

type shard[S any] struct {
	tab    atomic.Pointer[table[S]]
	judged atomic.Int64 // latest instant a clean-up of this shard judged from
	tomb   *entry[S]    // marks a removed slot
	clk    *clock.Source
	keys   *atomic.Int64 // the map's key count
	mu     sync.Mutex    // serializes writers: tab's contents, n, ring, free, hands
	n      int           // live keys
	ring   []*entry[S]   // CLOCK ring; nil slots are free
	free   []int
	hand   int // eviction hand
	sweep  int // idle-sweep hand
	_      [64]byte
}

// find returns the entry for key in t, or nil.
func (t *table[S]) find(key string, h uint64, tomb *entry[S]) *entry[S] {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		e := sl.e.Load()
		if e == nil {
			return nil
		}
		if sl.hash == h && e != tomb && e.is(key) {
			return e
		}
	}
}

// Map maps keys to per-key states of type S, which *S manages through the
// State interface. It is safe for concurrent use. Create it with New.
type Map[S any, P interface {
	*S
	State
}] struct {
	clk       clock.Source
	set       limiterkit.Settings
	seed      maphash.Seed
	shards    []shard[S]
	mask      uint64
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
	State
}](s limiterkit.Settings) *Map[S, P] {
	n := 1
	for n < maxShards && n*2*64 <= s.MaxKeys {
		n *= 2
	}
	m := &Map[S, P]{
		clk:    clock.New(s.Clock),
		set:    s,
		seed:   maphash.MakeSeed(),
		shards: make([]shard[S], n),
		mask:   uint64(n - 1),
	}
	for i := range m.shards {
		m.shards[i].tab.Store(newTable[S](8))
		m.shards[i].judged.Store(math.MinInt64) // nothing judged yet: lifts no reading, before 1970 too
		m.shards[i].tomb = new(entry[S])
		m.shards[i].clk = &m.clk
		m.shards[i].keys = &m.keys
	}
	if s.SweepInterval > 0 {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.sweeper(s.SweepInterval)
	}
	return m
}

// SetDebts turns on the debt table: states evicted by the MaxKeys cap
// while owing (their Evict word is not 0) leave their debt in a table of
// 2·MaxKeys cells indexed by key hash, allocated at the first such
// eviction; a new key starts from its own cell's debt, or from a cell that
// several keys' debts were merged into. A cell is cleared once its debt is
// paid. It must be called before the map is used, and only if *S
// implements Debtor.
func (m *Map[S, P]) SetDebts(d Debts[P]) { m.debts = d }

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

func newTable[S any](size int) *table[S] {
	return &table[S]{slots: make([]slot[S], size), mask: uint64(size - 1)}
}

func (m *Map[S, P]) locate(key string) (*shard[S], uint64) {
	h := maphash.String(m.seed, key)
	return &m.shards[h&m.mask], h
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
// a state idle at. The state may be retired concurrently at any time; the
// caller then calls Get again with the instant it got.
func (m *Map[S, P]) Get(key string, now int64) (P, int64) {
	sh, h := m.locate(key)
	e := sh.tab.Load().find(key, h>>8, sh.tomb)
	var p P
	if e == nil {
		p = m.insert(sh, key, h>>8)
	} else {
		if e.ref.Load() == 0 {
			e.ref.Store(1)
		}
		p = &e.state
	}
	if j := sh.judged.Load(); j > now {
		now = j
	}
	return p, now
}

// Begin does what every keyed decision does first: it checks that the map
// is open, the key, and n against limit (see limiterkit.CheckN), reads the
// clock once, and returns key's state and the instant to decide at (see
// Get). If the state turns out dead, the caller calls Get(key, now).
func (m *Map[S, P]) Begin(key string, n, limit int) (P, int64, error) {
	if err := m.Check(key); err != nil {
		return nil, 0, err
	}
	if n <= 0 || n > limit {
		return nil, 0, limiterkit.CheckN(n, limit)
	}
	p, now := m.Get(key, m.clk.Now())
	return p, now, nil
}

// Load returns the state of key, or nil if the key is absent.
func (m *Map[S, P]) Load(key string) P {
	sh, h := m.locate(key)
	if e := sh.tab.Load().find(key, h>>8, sh.tomb); e != nil {
		return &e.state
	}
	return nil
}

func (m *Map[S, P]) insert(sh *shard[S], key string, h uint64) P {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.tab.Load().find(key, h, sh.tomb); e != nil {
		return &e.state
	}
	m.sweepSome(sh, 2)
	if m.keys.Load() >= int64(m.set.MaxKeys) && !m.evictOne(sh) {
		m.evictElsewhere(sh)
	}
	// A new key starts unreferenced: one that is never used again is the
	// first to go, which keeps a scan of one-off keys from flushing the
	// keys in steady use.
	e := newEntry[S](key, h)
	if m.debts != nil && m.hasDebts.Load() {
		if d := m.owed(h, sh.Now()); d != 0 {
			m.debts.Owe(&e.state, d)
		}
	}
	if k := len(sh.free); k > 0 {
		sh.ring[sh.free[k-1]] = e
		sh.free = sh.free[:k-1]
	} else {
		sh.ring = append(sh.ring, e)
	}
	sh.publish(e)
	return &e.state
}

// publish adds e to the table, growing or rebuilding it first if needed;
// sh.mu must be held.
func (sh *shard[S]) publish(e *entry[S]) {
	t := sh.tab.Load()
	if 4*(t.used+1) > 3*len(t.slots) {
		size := len(t.slots)
		for 2*(sh.n+1) > size {
			size *= 2
		}
		for 8*(sh.n+1) < size && size > 8 {
			size /= 2
		}
		nt := newTable[S](size)
		for _, old := range sh.ring {
			if old != nil && old != e {
				nt.put(old)
			}
		}
		sh.tab.Store(nt) // readers of t still find every live entry in it
		t = nt
	}
	t.put(e)
	sh.n++
	sh.keys.Add(1)
}

// maxShards bounds the number of shards: enough that writers on distinct
// keys rarely meet on two cores or many.
const maxShards = 256

// put stores e in the first empty slot of its probe sequence; the writer's
// lock must be held. Tombstones are not reused, so that a concurrent probe
// never misses a key that is present.
func (t *table[S]) put(e *entry[S]) {
	i := e.hash & t.mask
	for t.slots[i].e.Load() != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i].hash = e.hash
	t.slots[i].e.Store(e)
	t.used++
}

// drop replaces e by tomb; the writer's lock must be held.
func (t *table[S]) drop(e, tomb *entry[S]) {
	for i := e.hash & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].e.Load() == e {
			t.slots[i].e.Store(tomb)
			return
		}
	}
}

// remove drops the entry at ring slot i; sh.mu must be held.
func (sh *shard[S]) remove(i int) {
	sh.tab.Load().drop(sh.ring[i], sh.tomb)
	sh.n--
	sh.keys.Add(-1)
	sh.ring[i] = nil
	sh.free = append(sh.free, i)
}

// sweepSome examines up to k ring slots for idle states; sh.mu must be held.
func (m *Map[S, P]) sweepSome(sh *shard[S], k int) {
	for ; k > 0 && len(sh.ring) > 0; k-- {
		sh.sweep = (sh.sweep + 1) % len(sh.ring)
		if e := sh.ring[sh.sweep]; e != nil && P(&e.state).Retire(sh, false) {
			sh.remove(sh.sweep)
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
// evictLook how many ring slots it examines in each.
const (
	evictTries = 4
	evictLook  = 64
)

// evictOne frees one slot of sh by the CLOCK policy and reports whether it
// did; sh.mu must be held. It fails when every state refuses.
func (m *Map[S, P]) evictOne(sh *shard[S]) bool {
	// The hand resumes where it stopped, so a bounded look costs O(1) per
	// insert even when most states refuse (units held by counting): such
	// a map grows past its cap a little instead of scanning every key.
	for range min(2*len(sh.ring), evictLook) {
		sh.hand = (sh.hand + 1) % len(sh.ring)
		e := sh.ring[sh.hand]
		switch {
		case e == nil:
			continue
		case e.ref.Load() != 0:
			e.ref.Store(0)
			continue
		case P(&e.state).Retire(sh, false):
		case m.debts != nil:
			if d := any(P(&e.state)).(Debtor).Evict(); d != 0 {
				m.evictions.Add(1)
				m.leave(e.hash, d, sh.Now())
			}
		case P(&e.state).Retire(sh, true):
			m.evictions.Add(1)
		default:
			continue
		}
		sh.remove(sh.hand)
		return true
	}
	return false
}

// Sweep drops every key whose state is full and returns how many it
// dropped.
func (m *Map[S, P]) Sweep() int {
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for j, e := range sh.ring {
			if e != nil && P(&e.state).Retire(sh, false) {
				sh.remove(j)
				dropped++
			}
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

// Range calls f for each key and state until f returns false. f runs under
// a shard's lock: it must not call into the Map.
func (m *Map[S, P]) Range(f func(key string, p P) bool) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, e := range sh.ring {
			if e != nil && !f(e.key(), &e.state) {
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
