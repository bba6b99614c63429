package keyed

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/limiterkit"
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

func newMap[S any, P interface {
	*S
	State
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

func TestMaxKeysEvictsLeastRecentlyUsed(t *testing.T) {
	const maxKeys = 64
	m := newMap[busy](t, throttle.WithMaxKeys(maxKeys))
	hot, _ := m.Get("hot", 0)
	hot.acquire()
	for i := range 1000 {
		m.Get("hot", 0) // keep it referenced
		get(m, fmt.Sprint(i)).acquire()
		if n := m.Len(); n > maxKeys {
			t.Fatalf("after %d inserts Len = %d, above MaxKeys %d", i, n, maxKeys)
		}
	}
	if m.Load("hot") != hot {
		t.Fatal("the most recently used key was evicted")
	}
	if got, want := m.Evictions(), uint64(1001-maxKeys); got != want {
		t.Fatalf("Evictions = %d, want %d", got, want)
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
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				m.Sweep()
			}
		}
	})
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 20000 {
				key := fmt.Sprint(rng.IntN(16))
				var p *busy
				for p, _ = m.Get(key, 0); !p.acquire(); p, _ = m.Get(key, 0) {
				}
				if q := m.Load(key); q != p {
					t.Errorf("key %s held on a state the map does not hold", key)
					return
				}
				p.n.Add(-1)
			}
		})
	}
	workers.Wait()
	close(stop)
	wg.Wait()
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

func TestKeysInlineAndLong(t *testing.T) {
	m := newMap[busy](t)
	keys := []string{"", "a", "abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwxy",
		"abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnopqrstuvwx\x00"}
	states := map[string]*busy{}
	for _, k := range keys {
		states[k], _ = m.Get(k, 0)
		states[k].acquire()
	}
	for _, k := range keys {
		if m.Load(k) != states[k] {
			t.Errorf("key %q (%d bytes) maps to another state", k, len(k))
		}
	}
	seen := map[string]bool{}
	m.Range(func(k string, p *busy) bool {
		if states[k] != p {
			t.Errorf("Range gave key %q with another state", k)
		}
		seen[k] = true
		return true
	})
	if len(seen) != len(keys) {
		t.Errorf("Range saw %d keys, want %d", len(seen), len(keys))
	}
}

func get[S any, P interface {
	*S
	State
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
