package keyed

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const dead = -1

// busy is a test state: a count of units in use; idle when zero.
type busy struct{ n atomic.Int64 }

func (s *busy) Retire(j Judge, force bool) bool {
	for {
		v := s.n.Load()
		if v == dead {
			return true
		}
		if v != 0 && !force {
			return false
		}
		if s.n.CompareAndSwap(v, dead) {
			return true
		}
	}
}

// Move moves the count to dst.
func (s *busy) Move(dst *busy) { dst.n.Store(s.n.Swap(dead)) }

// release gives a unit back, unless the state is dead (moved).
func (s *busy) release() bool {
	for {
		v := s.n.Load()
		if v == dead {
			return false
		}
		if s.n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

func (s *busy) acquire() bool {
	for {
		v := s.n.Load()
		if v == dead {
			return false
		}
		if s.n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// pinned refuses forced retirement while in use.
type pinned struct{ busy }

func (s *pinned) Retire(j Judge, force bool) bool { return s.busy.Retire(j, false) }

func (s *pinned) Move(dst *pinned) { s.busy.Move(&dst.busy) }

func newMap[S any, P interface {
	*S
	State[P]
}](t testing.TB, opts ...throttle.Option) *Map[S, P] {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		t.Fatal(err)
	}
	m := New[S, P](s)
	t.Cleanup(func() { m.Close() })
	return m
}

func TestGetLoad(t *testing.T) {
	m := newMap[busy](t)
	if m.Load("a") != nil {
		t.Fatal("Load of an absent key is not nil")
	}
	p, _ := m.Get("a", 0)
	if q, _ := m.Get("a", 0); q != p {
		t.Fatal("Get returned a different state for the same key")
	}
	if m.Load("a") != p || m.Len() != 1 {
		t.Fatalf("Load/Len after Get: %p %d", m.Load("a"), m.Len())
	}
}

func TestSweepDropsOnlyIdle(t *testing.T) {
	m := newMap[busy](t)
	for i := range 100 {
		p, _ := m.Get(fmt.Sprint(i), 0)
		if i%2 == 0 {
			p.acquire()
		}
	}
	m.Sweep()
	if m.Len() != 50 || m.Evictions() != 0 {
		t.Fatalf("Len %d Evictions %d, want 50 and 0", m.Len(), m.Evictions())
	}
}

func TestLazySweepOnInsert(t *testing.T) {
	m := newMap[busy](t)
	for i := range 10000 {
		m.Get(fmt.Sprint(i), 0) // idle from birth: dropped as others arrive
	}
	if n := m.Len(); n > 5000 {
		t.Fatalf("%d idle keys kept; lazy sweeping should drop them as new keys arrive", n)
	}
}

// TestMaxKeysEvictsLeastRecentlyUsed inserts one-off keys past MaxKeys
// while one key is looked up before each insert: that key is never
// evicted. Every map hashes with its own seed, so the hot key's slot lies
// at a different place from the hand each time; the first eviction, when
// every key is fresh and referenced, evicted it in 1 map of 64 when a
// look-up and an insert set the same reference bit.
func TestMaxKeysEvictsLeastRecentlyUsed(t *testing.T) {
	const maxKeys = 64
	for range 300 {
		m := newMap[busy](t, throttle.WithMaxKeys(maxKeys))
		hot, _ := m.Get("hot", 0)
		hot.acquire()
		for i := range 1000 {
			m.Get("hot", 0) // keep it referenced
			get(m, fmt.Sprint(i)).acquire()
			if n := m.Len(); n > maxKeys {
				t.Fatalf("after %d inserts Len = %d, above MaxKeys %d", i, n, maxKeys)
			}
			if p := m.Load("hot"); p == nil || p.n.Load() != 1 {
				t.Fatalf("the most recently used key was evicted at insert %d", i)
			}
		}
		if got, want := m.Evictions(), uint64(1001-maxKeys); got != want {
			t.Fatalf("Evictions = %d, want %d", got, want)
		}
		m.Close()
	}
}

func TestRefusedEvictionIsSoftCap(t *testing.T) {
	m := newMap[pinned](t, throttle.WithMaxKeys(4))
	for i := range 10 {
		get(m, fmt.Sprint(i)).acquire()
	}
	if m.Len() != 10 || m.Evictions() != 0 {
		t.Fatalf("Len %d Evictions %d: states that refuse eviction must be kept", m.Len(), m.Evictions())
	}
}

// TestRetireRace checks the retire protocol: while sweeps run, every unit
// acquired is acquired on the state the map holds for its key.
func TestRetireRace(t *testing.T) {
	m := newMap[busy](t, throttle.WithMaxKeys(1<<10))
	stop := testproc.Repeat(1, func() bool { m.Sweep(); return true })
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 20000 {
				key := fmt.Sprint(rng.IntN(16))
				var p *busy
				for p, _ = m.Get(key, 0); !p.acquire(); p, _ = m.Again(key, 0) {
				}
				// Only a move (the unit goes with it) makes a held state dead.
				if q := m.Load(key); q != p && p.n.Load() != dead {
					t.Errorf("key %s held on a state the map does not hold", key)
					return
				}
				for !p.release() {
					p, _ = m.Again(key, 0)
				}
			}
		})
	}
	workers.Wait()
	stop()
	m.Sweep()
	if m.Len() != 0 {
		t.Fatalf("Len = %d after all released and swept", m.Len())
	}
}

func TestSweeperStopsOnClose(t *testing.T) {
	m := newMap[busy](t, throttle.WithSweepInterval(time.Millisecond))
	m.Get("a", 0)
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if m.Len() != 0 {
		t.Fatal("the sweeper did not drop an idle key")
	}
	m.Close()
	m.Close()
	if !m.Closed() {
		t.Fatal("Closed() false after Close")
	}
}

func BenchmarkGet(b *testing.B) {
	for _, n := range []int{1, 100_000, 1_000_000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("client-%d", i)
		}
		m := newMap[busy](b)
		for _, k := range keys {
			get(m, k).acquire()
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m.Get(keys[i], 0)
				if i++; i == n {
					i = 0
				}
			}
		})
		// GetNow with and without the prefetch of a cold map's slot: the
		// clock's read and the slot's load, in turn or together.
		for _, pf := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%d/now/prefetch=%v", n, pf), func(b *testing.B) {
				cold := m.cold.Load()
				defer m.cold.Store(cold)
				m.cold.Store(cold && pf)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					m.GetNow(keys[i])
					if i++; i == n {
						i = 0
					}
				}
			})
		}
		b.Run(fmt.Sprintf("keys=%d/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(7919)) % n
				for pb.Next() {
					m.Get(keys[i], 0)
					if i++; i == n {
						i = 0
					}
				}
			})
		})
	}
}

// TestKeysDistinct: keys short, long, empty and alike each keep their
// own state, across the rebuilds that thousands of inserts cause, and
// Range visits each state once.
func TestKeysDistinct(t *testing.T) {
	m := newMap[busy](t)
	keys := []string{"", "a", "abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwxy",
		"abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnopqrstuvwx\x00", strings.Repeat("k", 4096)}
	for i := range 5000 {
		keys = append(keys, fmt.Sprint("key-", i))
	}
	for i, k := range keys {
		for range i%3 + 1 {
			get(m, k).acquire()
		}
	}
	for i, k := range keys {
		if p := m.Load(k); p == nil || p.n.Load() != int64(i%3+1) {
			t.Fatalf("key %q (%d bytes) lost its count", k[:min(len(k), 40)], len(k))
		}
	}
	seen := map[*busy]bool{}
	m.Range(func(p *busy) bool {
		if seen[p] {
			t.Error("Range visited a state twice")
		}
		seen[p] = true
		return true
	})
	if len(seen) != len(keys) || m.Len() != len(keys) {
		t.Errorf("Range saw %d states, Len %d; want %d", len(seen), m.Len(), len(keys))
	}
}

// TestSameTagOtherKey: a slot whose hash matches but whose second hash
// does not is another key's.
func TestSameTagOtherKey(t *testing.T) {
	ids := uint64(12345)
	tab := newTable[busy](minTable)
	const tag = 42<<8 | liveBit
	for _, k := range []string{"a", "b"} {
		sl := tab.claim(tag)
		sl.id = idOf(ids, k)
		sl.state.n.Store(int64(len(tab.slots) - tab.used))
		sl.tag.Store(tag)
	}
	a, b := tab.find(tag, "a", ids), tab.find(tag, "b", ids)
	if a == nil || b == nil || a == b {
		t.Fatalf("find: %p %p", a, b)
	}
	if tab.find(tag, "c", ids) != nil || tab.find(tag+4, "a", ids) != nil {
		t.Fatal("find matched a key by one hash only")
	}
}

// TestMovesLoseNothing: decisions on a few hot keys while inserts of
// one-off keys keep rebuilding the tables: every unit taken is on the
// key's state at the end (a move copies what a decision wrote, and a
// decision on a moved state looks the key up again).
func TestMovesLoseNothing(t *testing.T) {
	m := newMap[busy](t, throttle.WithMaxKeys(1<<12))
	const hot, per = 8, 20000
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				m.Get(fmt.Sprint("one-off-", i), 0) // idle: dropped lazily, its slot gone
			}
		}
	})
	var workers sync.WaitGroup
	for w := range 2 {
		workers.Go(func() {
			for i := range per {
				key := fmt.Sprint("hot-", (i+w)%hot)
				for p, _ := m.Get(key, 0); !p.acquire(); p, _ = m.Again(key, 0) {
				}
			}
		})
	}
	workers.Wait()
	close(stop)
	churn.Wait()
	var total int64
	for i := range hot {
		total += m.Load(fmt.Sprint("hot-", i)).n.Load()
	}
	if total != 2*per {
		t.Fatalf("%d units on the hot keys, want %d", total, 2*per)
	}
}

func get[S any, P interface {
	*S
	State[P]
}](m *Map[S, P], key string) P {
	p, _ := m.Get(key, 0)
	return p
}

// TestMaxKeysGlobal: the cap holds for the whole map, not per shard: a
// map holds exactly MaxKeys busy keys without evicting any, and never more.
func TestMaxKeysGlobal(t *testing.T) {
	for _, max := range []int{10, 1024, 4096} {
		m := newMap[busy](t, throttle.WithMaxKeys(max))
		for i := range max {
			get(m, fmt.Sprint("k", i)).acquire()
		}
		if m.Len() != max || m.Evictions() != 0 {
			t.Errorf("MaxKeys %d: Len %d, Evictions %d after %d busy keys; want %d, 0", max, m.Len(), m.Evictions(), max, max)
		}
		for i := range max {
			get(m, fmt.Sprint("j", i)).acquire()
			if m.Len() > max {
				t.Fatalf("MaxKeys %d: Len %d", max, m.Len())
			}
		}
		if m.Len() != max {
			t.Errorf("MaxKeys %d: Len %d after churn, want %d", max, m.Len(), max)
		}
	}
}

// TestGetBefore1970: with nothing judged yet, Get leaves a reading before
// 1970 as it is (it used to lift it to 1970, stopping time for every
// keyed limiter on a clock before 1970).
func TestGetBefore1970(t *testing.T) {
	m := newMap[busy](t)
	for _, now := range []int64{math.MinInt64, -5, -1, 0, 7} {
		if _, got := m.Get("k", now); got != now {
			t.Errorf("Get at %d decides at %d", now, got)
		}
	}
}

// TestIDsDistinct: keys alike in every way but one (a byte, a trailing
// zero, the length) get distinct second hashes.
func TestIDsDistinct(t *testing.T) {
	seen := map[uint64]string{}
	add := func(k string) {
		id := idOf(7, k)
		if o, ok := seen[id]; ok && o != k {
			t.Fatalf("%q and %q share an id", o, k)
		}
		seen[id] = k
	}
	for i := range 200_000 {
		add(fmt.Sprint("user:", i))
	}
	for n := range 40 {
		add(strings.Repeat("\x00", n))
		add(strings.Repeat("a", n))
		for i := range n {
			add(strings.Repeat("a", i) + "b" + strings.Repeat("a", n-i-1))
		}
	}
}

// BenchmarkEvict looks up keys drawn from four times MaxKeys, one in
// eight of them hot (looked up nine times in ten), each state in use:
// a miss evicts. evictions/op is the miss rate the CLOCK policy gives.
func BenchmarkEvict(b *testing.B) {
	const maxKeys = 1 << 16
	keys := make([]string, 4*maxKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	m := newMap[busy](b, throttle.WithMaxKeys(maxKeys))
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		k := r.IntN(len(keys))
		if r.IntN(10) != 0 {
			k /= 8
		}
		if p, _ := m.Get(keys[k], 0); p.n.Load() == 0 {
			p.acquire()
		}
	}
	b.ReportMetric(float64(m.Evictions())/float64(b.N), "evictions/op")
}

func BenchmarkID(b *testing.B) {
	for _, k := range []string{"user:12345", "2001:db8:85a3::8a2e:370:7334"} {
		b.Run(fmt.Sprint(len(k)), func(b *testing.B) {
			for b.Loop() {
				idOf(7, k)
			}
		})
	}
}

// TestSweepShrinks: once a flood of keys has passed, Sweep gives the
// tables' memory back, and the keys still held keep their units.
func TestSweepShrinks(t *testing.T) {
	m := newMap[busy](t)
	slots := func() (n int) {
		for i := range m.shards {
			n += len(m.shards[i].tab.Load().slots)
		}
		return n
	}
	empty := slots()
	get(m, "held").acquire()
	for i := range 100_000 {
		get(m, fmt.Sprint("flood-", i)).acquire()
	}
	if s := slots(); s < 100_000 {
		t.Fatalf("%d slots for a flood of 100,000 keys", s)
	}
	for i := range 100_000 {
		for p := get(m, fmt.Sprint("flood-", i)); !p.release(); p = get(m, fmt.Sprint("flood-", i)) {
		}
	}
	m.Sweep()
	if s := slots(); s > 2*empty || m.Len() != 1 {
		t.Fatalf("after Sweep: %d slots (empty map: %d), Len %d", s, empty, m.Len())
	}
	if p := m.Load("held"); p == nil || p.n.Load() != 1 {
		t.Fatal("the held key lost its unit")
	}
}

// TestWideSlotsAligned checks what a 112-byte state (the sliding log's)
// relies on: its slot is 128 bytes, and every table of such slots starts
// on a 128-byte boundary, so that each slot is one aligned pair of cache
// lines, whatever the table's length.
func TestWideSlotsAligned(t *testing.T) {
	type wide struct{ _ [14]uint64 }
	if got := unsafe.Sizeof(slot[wide]{}); got != 128 {
		t.Fatalf("slot of a 112-byte state: %d bytes, want 128", got)
	}
	for n := minTable; n < 1<<13; n += 1 + n/8 {
		if p := uintptr(unsafe.Pointer(&newTable[wide](n).slots[0])); p%128 != 0 {
			t.Errorf("table of %d slots at %#x: not 128-byte aligned", n, p)
		}
	}
}

// TestColdHint: a map turns cold (GetNow prefetches) once its tables
// outgrow coldBytes, and warm again once Sweep has shrunk them.
func TestColdHint(t *testing.T) {
	m := newMap[busy](t)
	get(m, "held").acquire()
	if m.cold.Load() {
		t.Fatal("a map of one key is cold")
	}
	// A 24-byte slot: coldBytes is about 44k slots, some 22k keys.
	const n = 100_000
	for i := range n {
		get(m, fmt.Sprint("flood-", i)).acquire()
	}
	if !m.cold.Load() {
		t.Fatalf("a map of %d keys (%d slots per shard, cold at %d) is not cold", m.Len(), len(m.shards[0].tab.Load().slots), m.coldAt)
	}
	if p, _ := m.GetNow("held"); p == nil || p.n.Load() != 1 {
		t.Fatal("GetNow on a cold map lost the held key's unit")
	}
	for i := range n {
		for p := get(m, fmt.Sprint("flood-", i)); !p.release(); p = get(m, fmt.Sprint("flood-", i)) {
		}
	}
	m.Sweep()
	if m.cold.Load() {
		t.Fatal("still cold after Sweep shrank the tables")
	}
}
