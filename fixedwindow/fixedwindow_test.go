package fixedwindow_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newWindow and newKeyed are the constructors of windows aligned to the
// clock (false) and anchored to a key's first request (true).
var (
	newWindow = map[bool]func(int, time.Duration, ...throttle.Option) (*fixedwindow.Window, error){false: fixedwindow.NewWindow, true: fixedwindow.NewAnchoredWindow}
	newKeyed  = map[bool]func(int, time.Duration, ...throttle.Option) (*fixedwindow.Limiter, error){false: fixedwindow.New, true: fixedwindow.NewAnchored}
)

// bound is the most a fixed window admits in a closed interval of length
// d: it meets at most ⌈d/window⌉+1 windows.
func bound(limit int, window time.Duration) func(time.Duration) int64 {
	return func(d time.Duration) int64 {
		return int64(limit) * ((int64(d)+int64(window)-1)/int64(window) + 1)
	}
}

func TestConformance(t *testing.T) {
	for _, c := range []struct {
		limit  int
		window time.Duration
	}{{1, time.Second}, {10, time.Second}, {100, 3 * time.Second}, {7, 90 * time.Minute}} {
		for _, anchored := range []bool{false, true} {
			name := fmt.Sprintf("%d/%v/anchored=%v", c.limit, c.window, anchored)
			s := throttletest.Suite{Limit: c.limit, Bound: bound(c.limit, c.window)}
			limitertest.Conformance(t, name, s, newWindow[anchored], newKeyed[anchored], c.limit, c.window)
		}
	}
}

func TestConstructorErrors(t *testing.T) {
	cases := []struct {
		name   string
		limit  int
		window time.Duration
		opts   []throttle.Option
	}{
		{"limit=0", 0, time.Second, nil},
		{"limit<0", -1, time.Second, nil},
		{"limit>Max", fixedwindow.MaxLimit + 1, time.Second, nil},
		{"window=0", 10, 0, nil},
		{"window<0", 10, -time.Second, nil},
		{"window>Max", 10, fixedwindow.MaxWindow + 1, nil},
		{"nil option", 10, time.Second, []throttle.Option{nil}},
		{"nil clock", 10, time.Second, []throttle.Option{throttle.WithClock(nil)}},
	}
	for _, c := range cases {
		if _, err := fixedwindow.NewWindow(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewWindow %s: err = %v, want ErrInvalid", c.name, err)
		}
		if _, err := fixedwindow.NewAnchoredWindow(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewAnchoredWindow %s: err = %v, want ErrInvalid", c.name, err)
		}
		if l, err := fixedwindow.New(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New %s: err = %v, want ErrInvalid", c.name, err)
			l.Close()
		}
		if l, err := fixedwindow.NewAnchored(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewAnchored %s: err = %v, want ErrInvalid", c.name, err)
			l.Close()
		}
	}
	for _, ok := range []struct {
		limit  int
		window time.Duration
	}{{1, 1}, {fixedwindow.MaxLimit, fixedwindow.MaxWindow}} {
		if _, err := fixedwindow.NewAnchoredWindow(ok.limit, ok.window); err != nil {
			t.Errorf("NewAnchoredWindow(%d, %v): %v", ok.limit, ok.window, err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	w := limitertest.New(t, newWindow[false], 5, time.Second)
	for _, c := range []struct {
		n    int
		want error
	}{{0, throttle.ErrInvalid}, {-3, throttle.ErrInvalid}, {6, throttle.ErrExceedsLimit}} {
		if _, err := w.AllowN(c.n); !errors.Is(err, c.want) {
			t.Errorf("AllowN(%d): err = %v, want %v", c.n, err, c.want)
		}
	}
	limitertest.ZeroValues(t, new(fixedwindow.Window), new(fixedwindow.Limiter))
}

type step = throttletest.Step

func admitted(ds []throttle.Decision, trace []step) int {
	sum := 0
	for i, d := range ds {
		if d.Allowed {
			sum += trace[i].N
		}
	}
	return sum
}

// TestBoundaryAttack is the known weakness: limit units in the last
// nanosecond of a window and limit more in the first nanosecond of the
// next, 2·limit within 2 ns.
func TestBoundaryAttack(t *testing.T) {
	const limit, win = 100, time.Minute
	clk := throttletest.NewClock() // Epoch is on a minute boundary
	w := limitertest.New(t, newWindow[false], limit, win, throttle.WithClock(clk))
	clk.Advance(win - 1)
	var trace []step
	for range limit + 1 {
		trace = append(trace, step{Advance: 0, N: 1})
	}
	trace = append(trace, step{Advance: 1, N: 1}) // the boundary
	for range limit {
		trace = append(trace, step{Advance: 0, N: 1})
	}
	ds := throttletest.Replay(t, w, clk, "k", trace)
	if got := admitted(ds, trace); got != 2*limit {
		t.Fatalf("boundary attack admitted %d, want exactly 2·limit = %d", got, 2*limit)
	}
	if d := ds[limit]; d.Allowed || d.RetryAfter != 1 {
		t.Fatalf("request %d in the old window: %+v, want denied with RetryAfter 1ns", limit+1, d)
	}
	if d := ds[len(ds)-1]; d.Allowed {
		t.Fatalf("request 2·limit+2 admitted: %+v", d)
	}
	// An anchored window does not reset at the clock's boundary: the
	// attack gets limit, then must wait a whole window.
	clk = throttletest.NewClock()
	a := limitertest.New(t, newWindow[true], limit, win, throttle.WithClock(clk))
	clk.Advance(win - 1)
	ds = throttletest.Replay(t, a, clk, "k", trace)
	if got := admitted(ds, trace); got != limit {
		t.Fatalf("anchored: admitted %d, want %d", got, limit)
	}
	if d := ds[len(ds)-1]; d.RetryAfter != win-1 {
		t.Fatalf("anchored: last denial %+v, want RetryAfter %v", d, win-1)
	}
	// But it has the same weakness at its own boundary: open a window
	// with 1 unit, fill it in its last nanosecond, refill in the first of
	// the next.
	clk.Advance(time.Hour)
	trace = []step{{Advance: 0, N: 1}, {Advance: win - 1, N: limit - 1}, {Advance: 0, N: 1}, {Advance: 1, N: limit}, {Advance: 0, N: 1}}
	ds = throttletest.Replay(t, a, clk, "k", trace)
	if !ds[0].Allowed || !ds[1].Allowed || ds[2].Allowed || !ds[3].Allowed || ds[4].Allowed {
		t.Fatalf("anchored boundary: %+v", ds)
	}
}

// TestSteadyOverRate sends twice the limit, evenly spread: each window
// admits exactly limit, the first ones of the window.
func TestSteadyOverRate(t *testing.T) {
	const limit, win = 10, time.Second
	for _, anchored := range []bool{false, true} {
		clk := throttletest.NewClock()
		w := limitertest.New(t, newWindow[anchored], limit, win, throttle.WithClock(clk))
		trace := make([]step, 20*2*limit) // 20 windows at 2·limit per window
		for i := range trace {
			trace[i] = step{Advance: win / (2 * limit), N: 1}
		}
		ds := throttletest.Replay(t, w, clk, "k", trace)
		for i, d := range ds {
			// Request i is at (i+1)·50ms: position (i+1)%20 in its second.
			// Aligned: the first window has positions 1..19 and admits 1..10,
			// the later ones admit 0..9. Anchored: the windows open at 50ms,
			// 1.05s, 2.05s, ... and admit positions 1..10.
			pos := (i + 1) % (2 * limit)
			want := pos < limit
			if anchored || i+1 < 2*limit {
				want = pos >= 1 && pos <= limit
			}
			if d.Allowed != want {
				t.Fatalf("anchored=%v: request %d: %+v, want allowed=%v", anchored, i, d, want)
			}
		}
		want := 20*limit + 1 // the last request, at 20s, opens window 20
		if anchored {
			want = 20 * limit
		}
		if got := admitted(ds, trace); got != want {
			t.Fatalf("anchored=%v: admitted %d, want %d", anchored, got, want)
		}
	}
}

// TestBurstyOnOff alternates 300ms bursts of 50 requests with 1.7s of
// silence.
func TestBurstyOnOff(t *testing.T) {
	const limit, win = 20, time.Second
	var trace []step
	for range 10 {
		trace = append(trace, step{Advance: 1700 * time.Millisecond, N: 1})
		for range 49 {
			trace = append(trace, step{Advance: 6 * time.Millisecond, N: 1})
		}
	}
	// Cycle c starts at 1.7s + 2s·c (a whole cycle is 1.7s + 49·6ms = 1.994s,
	// so it drifts 6ms a cycle); each burst lasts 294ms.
	// Aligned: burst c spans [1.7+1.994c, 1.994+1.994c]; it crosses a second
	// boundary when frac(1.7+1.994c) > 0.706, never for c < 10, so each
	// burst gets exactly limit.
	for _, anchored := range []bool{false, true} {
		clk := throttletest.NewClock()
		w := limitertest.New(t, newWindow[anchored], limit, win, throttle.WithClock(clk))
		ds := throttletest.Replay(t, w, clk, "k", trace)
		for c := range 10 {
			got := admitted(ds[c*50:(c+1)*50], trace[c*50:(c+1)*50])
			if got != limit {
				t.Fatalf("anchored=%v burst %d admitted %d, want %d", anchored, c, got, limit)
			}
			for i := c * 50; i < c*50+limit; i++ {
				if !ds[i].Allowed {
					t.Fatalf("anchored=%v: request %d denied, want the first %d of each burst admitted", anchored, i, limit)
				}
			}
		}
	}
}

func TestAnchoredKeysResetApart(t *testing.T) {
	clk := throttletest.NewClock()
	l := limitertest.New(t, newKeyed[true], 2, time.Second, throttle.WithClock(clk))
	mustAllow := func(key string, want bool) throttle.Decision {
		t.Helper()
		d, err := l.Allow(t.Context(), key, 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("%q: %+v, %v; want allowed=%v", key, d, err, want)
		}
		return d
	}
	mustAllow("a", true)
	mustAllow("a", true)
	clk.Advance(400 * time.Millisecond)
	mustAllow("b", true)
	mustAllow("b", true)
	if d := mustAllow("a", false); d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("a: RetryAfter %v, want 600ms", d.RetryAfter)
	}
	if d := mustAllow("b", false); d.RetryAfter != time.Second {
		t.Fatalf("b: RetryAfter %v, want 1s", d.RetryAfter)
	}
	clk.Advance(600 * time.Millisecond)
	mustAllow("a", true)
	mustAllow("b", false)
	// The window of a opened at 1s; b's at 400ms: a new window for b opens
	// at its first hit after 1.4s, not on a grid.
	clk.Advance(1234 * time.Millisecond)
	if d := mustAllow("b", true); d.ResetAfter != time.Second {
		t.Fatalf("b reopened: ResetAfter %v, want a whole window", d.ResetAfter)
	}
}

// TestAnchoredCoarseTicks covers a limit and window large enough that the
// opening instant is kept in ticks longer than 1 ns: the window may last
// up to a tick longer, never shorter.
func TestAnchoredCoarseTicks(t *testing.T) {
	const limit = fixedwindow.MaxLimit
	const win = 300 * 24 * time.Hour
	clk := throttletest.NewClock()
	clk.Advance(12345) // off any tick
	w := limitertest.New(t, newWindow[true], limit, win, throttle.WithClock(clk))
	d, err := w.AllowN(limit)
	if err != nil || !d.Allowed {
		t.Fatalf("AllowN(limit): %+v, %v", d, err)
	}
	if d.ResetAfter < win || d.ResetAfter > win+win>>19 {
		t.Fatalf("ResetAfter %v, want within [%v, %v]", d.ResetAfter, win, win+win>>19)
	}
	d, _ = w.AllowN(1)
	clk.Advance(d.RetryAfter - 1)
	if d, _ := w.AllowN(1); d.Allowed {
		t.Fatal("admitted 1ns before RetryAfter")
	}
	clk.Advance(1)
	if d, _ := w.AllowN(1); !d.Allowed {
		t.Fatalf("denied at RetryAfter: %+v", d)
	}
}

func TestKeyedRetiresClosedWindows(t *testing.T) {
	for _, anchored := range []bool{false, true} {
		clk := throttletest.NewClock()
		l := limitertest.New(t, newKeyed[anchored], 3, time.Second, throttle.WithClock(clk), throttle.WithMaxKeys(1<<12))
		for i := range 5000 {
			clk.Advance(time.Millisecond)
			if d, err := l.Allow(t.Context(), fmt.Sprint("k", i), 1); err != nil || !d.Allowed {
				t.Fatalf("key %d: %+v, %v", i, d, err)
			}
		}
		// Keys older than a window are full again and are dropped lazily
		// as new keys arrive; far fewer than 5000 remain.
		if n := l.Len(); n > 3000 {
			t.Fatalf("anchored=%v: %d keys kept", anchored, n)
		}
	}
}

// TestStress hammers one key from many goroutines while the clock moves,
// then checks from the decisions that no window admitted more than limit.
// The window of an admission is recovered from its ResetAfter: the window
// ends at now+ResetAfter, and now lies between the clock readings taken
// around the call, which are less than a window apart.
func TestStress(t *testing.T) {
	const limit, win = 50, time.Millisecond
	for _, anchored := range []bool{false, true} {
		for _, keyed := range []bool{false, true} {
			clk := throttletest.NewClock()
			var l throttle.Limiter
			if keyed {
				l = limitertest.New(t, newKeyed[anchored], limit, win, throttle.WithClock(clk))
			} else {
				l = limitertest.New(t, newWindow[anchored], limit, win, throttle.WithClock(clk))
			}
			var mu sync.Mutex
			var ends []int64 // earliest possible end of each admitted unit's window
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					var mine []int64
					for i := range 3000 {
						if i%10 == 0 {
							clk.Advance(win / 50)
						}
						before := clk.Now().UnixNano()
						d, err := l.Allow(t.Context(), "hot", 1)
						after := clk.Now().UnixNano()
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed && after-before < int64(win)/4 {
							mine = append(mine, before+int64(d.ResetAfter))
						}
					}
					mu.Lock()
					ends = append(ends, mine...)
					mu.Unlock()
				})
			}
			wg.Wait()
			// Windows do not overlap, so their ends are at least a window
			// apart; each estimate is within win/4 below the true end.
			sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
			windows, count, total := 0, 0, 0
			for i, e := range ends {
				if i == 0 || e-ends[i-1] > int64(win)/2 {
					windows++
					count = 0
				}
				count++
				total++
				if count > limit {
					t.Fatalf("anchored=%v keyed=%v: a window admitted more than %d: %v", anchored, keyed, limit, ends[max(0, i-60):i+1])
				}
			}
			if windows < 5 || total == 0 {
				t.Fatalf("anchored=%v keyed=%v: only %d windows, %d admitted; the stress did not stress", anchored, keyed, windows, total)
			}
		}
	}
}

func ExampleNew() {
	clk := throttletest.NewClock() // a virtual clock; omit WithClock in real use
	l, err := fixedwindow.New(3, time.Minute, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	for range 4 {
		d, _ := l.Allow(context.Background(), "client-42", 1)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	clk.Advance(time.Minute) // the next window
	d, _ := l.Allow(context.Background(), "client-42", 1)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1m0s
	// true 2
}
