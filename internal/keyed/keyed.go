package keyed

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// The Map: its shards, construction, clock, size, iteration and closing.

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

// Now reads the map's clock, in nanoseconds since the Unix epoch.
func (m *Map[S, P]) Now() int64 { return m.clk.Now() }

// locate returns key's shard and live tag.
func (m *Map[S, P]) locate(key string) (*shard[S], uint64) {
	h := maphash.String(m.seed, key)
	return &m.shards[h&m.mask], tagOf(h)
}

// Len returns the number of keys held.
func (m *Map[S, P]) Len() int { return int(m.keys.Load()) }

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
