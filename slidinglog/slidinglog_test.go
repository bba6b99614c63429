package slidinglog

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is the most a sliding log may admit in a closed interval of
// length d: it is covered by d/window+1 half-open windows.
func bound(limit int, window time.Duration) func(time.Duration) int64 {
	return func(d time.Duration) int64 { return int64(limit) * (int64(d/window) + 1) }
}

func TestConformance(t *testing.T) {
	for _, c := range []struct {
		limit  int
		window time.Duration
	}{{1, time.Second}, {10, time.Second}, {100, 3 * time.Second}, {7, 90 * time.Minute}} {
		s := throttletest.Suite{Limit: c.limit, Bound: bound(c.limit, c.window)}
		limitertest.Conformance(t, fmt.Sprintf("%d/%v", c.limit, c.window), s, NewLog, New, c.limit, c.window)
	}
}

// model is the textbook sliding log: every admission with its full
// timestamp, searched linearly.
type model struct {
	limit  int64
	window int64
	ts, n  []int64
	seen   int64
}

func (m *model) decide(now, n int64) throttle.Decision {
	// Entries expired by a later time stay expired if the clock steps back.
	if m.ts == nil && m.seen == 0 {
		m.seen = math.MinInt64
	}
	m.seen = max(m.seen, now)
	for len(m.ts) > 0 && m.ts[0] <= m.seen-m.window {
		m.ts, m.n = m.ts[1:], m.n[1:]
	}
	var in int64
	for _, c := range m.n {
		in += c
	}
	d := throttle.Decision{Limit: int(m.limit)}
	if in+n <= m.limit {
		at := m.seen
		m.ts, m.n = append(m.ts, at), append(m.n, n)
		d.Allowed, d.Remaining, d.ResetAfter = true, int(m.limit-in-n), time.Duration(at+m.window-now)
		return d
	}
	d.Remaining = int(m.limit - in)
	need := in + n - m.limit
	for i, t := range m.ts {
		if need -= m.n[i]; need <= 0 {
			d.RetryAfter = time.Duration(t + m.window - now)
			break
		}
	}
	d.ResetAfter = time.Duration(m.ts[len(m.ts)-1] + m.window - now)
	return d
}

type admit struct{ t, n int64 }

// checkWindows checks every half-open window [a, a+window) of an
// admission trace: the worst window starts at an admission, so it checks
// the window starting at each, with two pointers.
func checkWindows(t testing.TB, admits []admit, limit int64, window int64) {
	t.Helper()
	sort.SliceStable(admits, func(i, j int) bool { return admits[i].t < admits[j].t })
	var sum int64
	j := 0
	for i := range admits {
		for ; j < len(admits) && admits[j].t < admits[i].t+window; j++ {
			sum += admits[j].n
		}
		if sum > limit {
			t.Fatalf("window [%d, %d) holds %d units, limit %d", admits[i].t, admits[i].t+window, sum, limit)
		}
		sum -= admits[i].n
	}
}

// TestExactAgainstModel runs long random traces, including weighted
// requests, a clock that steps back, and windows that force rebases and
// split counts, and requires every Decision field to equal the textbook
// log's, then checks every window of the trace.
func TestExactAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	windows := []time.Duration{1, 3, time.Microsecond, 17 * time.Millisecond, time.Second, time.Hour, maxWindow / 2, maxWindow}
	traces := 200
	if raceOn {
		traces = 40
	}
	for trace := range traces {
		limit := 1 + rng.IntN(40)
		if trace%10 == 0 {
			limit = 1 + rng.IntN(2000)
		}
		window := windows[trace%len(windows)]
		if window > time.Hour {
			window -= time.Duration(rng.Int64N(1000))
		} else if window > 3 {
			window += time.Duration(rng.Int64N(int64(window)))
		}
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, limit, window, throttle.WithClock(clk))
		kl := limitertest.New(t, New, limit, window, throttle.WithClock(clk))
		m := &model{limit: int64(limit), window: int64(window)}
		var admits []admit
		step := 1 + rng.Int64N(int64(min(window, time.Hour)))
		for i := range 3000 {
			switch r := rng.IntN(100); {
			case r < 60:
				clk.Advance(time.Duration(rng.Int64N(max(1, step*3/4/(int64(limit)/4+1)))))
			case r < 90:
			case r < 99:
				clk.Advance(time.Duration(rng.Int64N(step)))
			default:
				clk.Advance(-time.Duration(rng.Int64N(step))) // steps back
			}
			n := 1
			if rng.IntN(4) == 0 {
				n = 1 + rng.IntN(limit)
			}
			now := clk.Now().UnixNano()
			want := m.decide(now, int64(n))
			got, err := lg.AllowN(n)
			if err != nil || got != want {
				t.Fatalf("trace %d (limit %d, window %v) step %d n=%d: Log = %+v, %v; want %+v", trace, limit, window, i, n, got, err, want)
			}
			got, err = kl.Allow(t.Context(), "k", n)
			if err != nil || got != want {
				t.Fatalf("trace %d (limit %d, window %v) step %d n=%d: Limiter = %+v, %v; want %+v", trace, limit, window, i, n, got, err, want)
			}
			if got.Allowed {
				admits = append(admits, admit{m.ts[len(m.ts)-1], int64(n)})
			}
		}
		checkWindows(t, admits, int64(limit), int64(window))
	}
}

// TestEveryWindow checks every window of long traces on a clock that
// only moves forward, on the Log alone (no model).
func TestEveryWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	traces := 30
	if raceOn {
		traces = 5
	}
	for trace := range traces {
		limit := 1 + rng.IntN(100)
		window := time.Duration(1 + rng.Int64N(int64(time.Second)))
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, limit, window, throttle.WithClock(clk))
		var admits []admit
		var denied int
		for range 20000 {
			clk.Advance(time.Duration(rng.Int64N(int64(window) / int64(limit) * 2)))
			n := 1 + rng.IntN(min(limit, 3))
			d, err := lg.AllowN(n)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admits = append(admits, admit{clk.Now().UnixNano(), int64(n)})
			} else {
				denied++
			}
		}
		if denied == 0 {
			t.Fatalf("trace %d never hit the limit", trace)
		}
		checkWindows(t, admits, int64(limit), int64(window))
	}
}

// Deterministic traces with exact expected admits.
func TestTraces(t *testing.T) {
	run := func(t *testing.T, limit int, window time.Duration, steps int, every time.Duration, n int) (admitted int, at []time.Duration) {
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, limit, window, throttle.WithClock(clk))
		for i := range steps {
			if d, _ := lg.AllowN(n); d.Allowed {
				admitted += n
				at = append(at, time.Duration(i)*every)
			}
			clk.Advance(every)
		}
		return admitted, at
	}
	t.Run("SteadyOverRate", func(t *testing.T) {
		// 100 req/s against 10 per second for 10 s: the first 10 of each
		// second, exactly 100, at 0, 10, ..., 90 ms of every second.
		got, at := run(t, 10, time.Second, 1000, 10*time.Millisecond, 1)
		if got != 100 {
			t.Fatalf("admitted %d, want 100", got)
		}
		for i, a := range at {
			if want := time.Duration(i/10)*time.Second + time.Duration(i%10)*10*time.Millisecond; a != want {
				t.Fatalf("admission %d at %v, want %v", i, a, want)
			}
		}
	})
	t.Run("JustOverRate", func(t *testing.T) {
		// One request every 99 ms against 10 per 990 ms... plus 1 ns:
		// the 11th request at 990 ms finds the first still in the window
		// (it leaves at 990 ms + 1 ns) so it is denied, the next admitted.
		got, _ := run(t, 10, 990*time.Millisecond+1, 1000, 99*time.Millisecond, 1)
		// Each cycle admits 10 and denies 1: 11 requests per 10 admits.
		if want := 1000/11*10 + min(1000%11, 10); got != want {
			t.Fatalf("admitted %d, want %d", got, want)
		}
	})
	t.Run("BurstyOnOff", func(t *testing.T) {
		// Bursts of 25 single requests every 700 ms against 10 per second:
		// a burst is admitted in full (10) only when the previous admitted
		// burst is 1 s old, so every other burst: 10·ceil(N/2).
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, 10, time.Second, throttle.WithClock(clk))
		const bursts = 101
		total := 0
		for b := range bursts {
			got := 0
			for range 25 {
				if d, _ := lg.AllowN(1); d.Allowed {
					got++
				}
			}
			if want := 10 * (1 - b%2); got != want {
				t.Fatalf("burst %d admitted %d, want %d", b, got, want)
			}
			total += got
			clk.Advance(700 * time.Millisecond)
		}
		if total != 10*51 {
			t.Fatalf("admitted %d, want %d", total, 10*51)
		}
	})
	t.Run("OnOffWeighted", func(t *testing.T) {
		// On for 300 ms (a request of 3 every 50 ms: 7 requests), off for
		// 700 ms, against 12 per second: each on phase admits 4 requests
		// (12 units) at 0..150 ms and denies 3; the next phase starts at
		// 1000 ms, exactly when the first admission expires.
		clk := throttletest.NewClock()
		lg := limitertest.New(t, NewLog, 12, time.Second, throttle.WithClock(clk))
		for cycle := range 50 {
			got := 0
			for i := range 7 {
				d, _ := lg.AllowN(3)
				if d.Allowed {
					got += 3
				} else if want := time.Second - time.Duration(i)*50*time.Millisecond; d.RetryAfter != want {
					t.Fatalf("cycle %d request %d: RetryAfter %v, want %v", cycle, i, d.RetryAfter, want)
				}
				clk.Advance(50 * time.Millisecond)
			}
			if got != 12 {
				t.Fatalf("cycle %d admitted %d, want 12", cycle, got)
			}
			clk.Advance(650 * time.Millisecond)
		}
	})
}

func TestRetryAfterExact(t *testing.T) {
	clk := throttletest.NewClock()
	lg := limitertest.New(t, NewLog, 5, time.Second, throttle.WithClock(clk))
	for i := range 5 { // admissions at 0, 1, 2, 3, 4 ms
		if d, _ := lg.AllowN(1); !d.Allowed {
			t.Fatalf("admission %d denied", i)
		}
		clk.Advance(time.Millisecond)
	}
	// At 5 ms, n=3 needs the entries at 0, 1 and 2 ms to leave: at 1002 ms.
	d, _ := lg.AllowN(3)
	if d.Allowed || d.RetryAfter != 997*time.Millisecond || d.ResetAfter != 999*time.Millisecond || d.Remaining != 0 {
		t.Fatalf("AllowN(3) = %+v, want denied, RetryAfter 997ms, ResetAfter 999ms", d)
	}
	clk.Advance(d.RetryAfter - 1)
	if d, _ := lg.AllowN(3); d.Allowed || d.RetryAfter != 1 || d.Remaining != 2 {
		t.Fatalf("1 ns early: %+v, want denied with RetryAfter 1ns, Remaining 2", d)
	}
	clk.Advance(1)
	if d, _ := lg.AllowN(3); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("at RetryAfter: %+v, want allowed, Remaining 0", d)
	}
}

func TestBadInput(t *testing.T) {
	for _, c := range []struct {
		name   string
		limit  int
		window time.Duration
		opts   []throttle.Option
	}{
		{"limit=0", 0, time.Second, nil},
		{"limit<0", -1, time.Second, nil},
		{"window=0", 1, 0, nil},
		{"window<0", 1, -time.Second, nil},
		{"window>maxWindow", 1, maxWindow + 1, nil},
		{"nil option", 1, time.Second, []throttle.Option{nil}},
		{"MaxKeys=0", 1, time.Second, []throttle.Option{throttle.WithMaxKeys(0)}},
	} {
		if _, err := New(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New %s: err = %v, want ErrInvalid", c.name, err)
		}
		if _, err := NewLog(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewLog %s: err = %v, want ErrInvalid", c.name, err)
		}
	}
	lg := limitertest.New(t, NewLog, 3, time.Second)
	for _, c := range []struct {
		n    int
		want error
	}{{0, throttle.ErrInvalid}, {-5, throttle.ErrInvalid}, {4, throttle.ErrExceedsLimit}} {
		if d, err := lg.AllowN(c.n); !errors.Is(err, c.want) || d.Allowed {
			t.Errorf("AllowN(%d) = %+v, %v; want %v", c.n, d, err, c.want)
		}
	}
}

// TestPacking drives the entry layout to its edges: the longest window
// leaves one count bit, so a weighted request spans entries.
func TestPacking(t *testing.T) {
	p, err := newParams(1000, maxWindow)
	if err != nil || p.maxCount != 1 {
		t.Fatalf("maxWindow params = %+v, %v; want one count bit", p, err)
	}
	clk := throttletest.NewClock()
	lg := limitertest.New(t, NewLog, 1000, maxWindow, throttle.WithClock(clk))
	if d, _ := lg.AllowN(1000); !d.Allowed || lg.log.entries() != 1000 {
		t.Fatalf("AllowN(1000) = %+v with %d entries, want allowed in 1000 entries", d, lg.log.entries())
	}
	clk.Advance(maxWindow - 1)
	if d, _ := lg.AllowN(1); d.Allowed || d.RetryAfter != 1 {
		t.Fatalf("1 ns before expiry: %+v, want RetryAfter 1ns", d)
	}
	clk.Advance(1)
	if d, _ := lg.AllowN(1000); !d.Allowed {
		t.Fatalf("after expiry: %+v, want allowed", d)
	}

	// A short window rebases often; the ring must stay exact across it.
	clk = throttletest.NewClock()
	lg = limitertest.New(t, NewLog, 3, 4, throttle.WithClock(clk)) // 4 ns: offsets on 4 bits
	for i := range 1000 {                                          // 3 admitted in every 4 ns
		if d, _ := lg.AllowN(1); d.Allowed != (i%4 != 3) {
			t.Fatalf("%d ns: %+v", i, d)
		}
		clk.Advance(1)
	}
	if lg.log.base < throttletest.Epoch.UnixNano()+900 {
		t.Fatalf("base %d never moved", lg.log.base)
	}
}

func TestIdleKeysDropped(t *testing.T) {
	clk := throttletest.NewClock()
	l := limitertest.New(t, New, 5, time.Second, throttle.WithClock(clk))
	for i := range 1000 {
		if d, err := l.Allow(t.Context(), string(rune('a'+i%26))+string(rune('a'+i/26)), 3); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	if l.Len() != 1000 {
		t.Fatalf("Len = %d, want 1000", l.Len())
	}
	// A key is dropped once its log is empty.
	clk.Advance(time.Second - 1)
	if n := l.Sweep(); n != 0 || l.Len() != 1000 {
		t.Fatalf("Sweep 1 ns early dropped %d, Len %d; want 0, 1000", n, l.Len())
	}
	clk.Advance(1)
	if n := l.Sweep(); n != 1000 || l.Len() != 0 {
		t.Fatalf("Sweep after a window dropped %d, Len %d; want 1000, 0", n, l.Len())
	}
	// A dropped key starts fresh, which is exact: its log was empty.
	if d, _ := l.Allow(t.Context(), "aa", 5); !d.Allowed {
		t.Fatalf("Allow after drop: %+v", d)
	}
}

// TestStress hammers a few keys from many goroutines on a fake clock
// (testing/synctest: time moves only when every goroutine sleeps, so the
// time read right after Allow is the time the limiter read), with the
// sweeper dropping idle keys meanwhile, then checks every window of what
// each key admitted. Run it with -race.
func TestStress(t *testing.T) {
	for _, single := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			const limit, window = 50, 100 * time.Millisecond
			var lim throttle.Limiter
			clk := throttle.WithClock(sysClock{})
			if single {
				lim = limitertest.New(t, NewLog, limit, window, clk)
			} else {
				l := limitertest.New(t, New, limit, window, clk, throttle.WithSweepInterval(30*time.Millisecond))
				defer l.Close()
				lim = l
			}
			keys := []string{"hot", "hot", "hot", "a", "b", "c", "d", "e"}
			var mu sync.Mutex
			admits := map[string][]admit{}
			start := time.Now()
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					mine := map[string][]admit{}
					for range 2000 {
						if rng.IntN(2) == 0 {
							time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond))))
						}
						key := keys[rng.IntN(len(keys))]
						if single {
							key = "hot"
						}
						n := 1 + rng.IntN(3)
						d, err := lim.Allow(t.Context(), key, n)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							mine[key] = append(mine[key], admit{time.Now().UnixNano(), int64(n)})
						}
					}
					mu.Lock()
					for k, a := range mine {
						admits[k] = append(admits[k], a...)
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			for _, a := range admits {
				checkWindows(t, a, limit, int64(window))
			}
			// The hot key is asked for far more than its limit all along.
			var hot int64
			for _, x := range admits["hot"] {
				hot += x.n
			}
			if windows := int64(time.Since(start) / window); windows < 5 || hot < limit*windows/2 {
				t.Fatalf("hot key admitted %d units in %d windows", hot, windows)
			}
		})
	}
}

// TestMovedLogKeepsItsEntries admits on one key from several goroutines
// while another inserts thousands of keys, so that the map rebuilds the
// hot key's table, moving its log, many times meanwhile. Time stands
// still, so the hot key must admit exactly limit units in all: a move
// that lost entries would let more through, one that lost the key's
// place would panic or hang.
func TestMovedLogKeepsItsEntries(t *testing.T) {
	const limit = 500
	clk := throttletest.NewClock()
	l := limitertest.New(t, New, limit, time.Hour, throttle.WithClock(clk))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2 * limit {
				d, err := l.Allow(t.Context(), "hot", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 20_000 {
			if _, err := l.Allow(t.Context(), fmt.Sprint("k", i), 1); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("hot key admitted %d units while its table was rebuilt, want %d", got, limit)
	}
	if d, _ := l.Allow(t.Context(), "hot", 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the moves: %+v, want denied with nothing remaining", d)
	}
}

type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

// TestNoAllocs: once a log has grown to its working size, neither an
// admission nor a denial allocates.
func TestNoAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates")
	}
	clk := throttletest.NewClock()
	lg := limitertest.New(t, NewLog, 8, time.Second, throttle.WithClock(clk))
	kl := limitertest.New(t, New, 8, time.Second, throttle.WithClock(clk))
	step := func() {
		clk.Advance(100 * time.Millisecond) // 10 calls per window: some denied
		lg.AllowN(1)
		kl.Allow(t.Context(), "k", 1)
		lg.AllowN(2)
		kl.Allow(t.Context(), "k", 2)
	}
	for range 100 {
		step()
	}
	if a := testing.AllocsPerRun(1000, step); a != 0 {
		t.Fatalf("%v allocations per step, want 0", a)
	}
}

// TestBeforeEpoch runs the log on a clock reading times before 1970
// (negative nanoseconds), where a zero "full until" must not be taken for
// a time in the future.
func TestBeforeEpoch(t *testing.T) {
	clk := new(throttletest.Clock) // reads the Unix epoch
	clk.Advance(-time.Hour)
	lg := limitertest.New(t, NewLog, 2, time.Second, throttle.WithClock(clk))
	m := &model{limit: 2, window: int64(time.Second)}
	admitted := 0
	for i := range 50 {
		want := m.decide(clk.Now().UnixNano(), 1)
		got, _ := lg.AllowN(1)
		if got != want {
			t.Fatalf("step %d: %+v, want %+v", i, got, want)
		}
		if got.Allowed {
			admitted++
		}
		clk.Advance(300 * time.Millisecond)
	}
	// 15 s at 2 per second, one request every 300 ms: 2 of every 4 calls
	// (1.2 s), plus the last 2 calls.
	if want := 50/4*2 + 2; admitted != want {
		t.Fatalf("admitted %d, want %d", admitted, want)
	}
}

// TestEntryCapacity pins the units one log entry holds per window length,
// as the package documentation states them.
func TestEntryCapacity(t *testing.T) {
	for _, c := range []struct {
		window time.Duration
		units  uint64
	}{
		{time.Second, 8589934591},
		{time.Hour, 2097151},
		{30 * 24 * time.Hour, 2047},
		{366 * 24 * time.Hour, 255},
		{maxWindow, 1},
	} {
		p, err := newParams(10, c.window)
		if err != nil {
			t.Fatal(err)
		}
		if p.maxCount != c.units || p.maxCount != 1<<(63-bits.Len64(uint64(c.window)))-1 {
			t.Errorf("window %v: an entry holds %d units, documented %d", c.window, p.maxCount, c.units)
		}
	}
	if got := (uint64(1<<22) + 254) / 255; got != 16449 {
		t.Errorf("AllowN(1<<22) at 366 days takes %d entries, documented 16449", got)
	}
}
