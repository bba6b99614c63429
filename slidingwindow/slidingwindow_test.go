package slidingwindow_test

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
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// form is one of the two algorithms: slots 0 is the weighted estimate.
type form struct {
	limit  int
	window time.Duration
	slots  int
}

func (f form) String() string {
	if f.slots == 0 {
		return fmt.Sprintf("weighted/%d/%v", f.limit, f.window)
	}
	return fmt.Sprintf("slotted%d/%d/%v", f.slots, f.limit, f.window)
}

func (f form) window1(t testing.TB, opts ...throttle.Option) *slidingwindow.Window {
	t.Helper()
	return limitertest.New(t, limitertest.Slotted(f.slots, slidingwindow.NewWindow, slidingwindow.NewSlottedWindow), f.limit, f.window, opts...)
}

func (f form) keyed(t testing.TB, opts ...throttle.Option) *slidingwindow.Limiter {
	t.Helper()
	return limitertest.New(t, limitertest.Slotted(f.slots, slidingwindow.New, slidingwindow.NewSlotted), f.limit, f.window, opts...)
}

// bound is the most the form admits in a closed interval of length d. The
// weighted form admits at most limit per aligned window, and the interval
// meets ⌈d/W⌉+1 of them; the slotted form at most limit per k consecutive
// slots, and the interval meets ⌈d/s⌉+1 slots.
func (f form) bound(d time.Duration) int64 {
	unit, per := int64(f.window), int64(1)
	if f.slots > 0 {
		unit, per = int64(f.window)/int64(f.slots), int64(f.slots)
	}
	units := (int64(d)+unit-1)/unit + 1
	return int64(f.limit) * ((units + per - 1) / per)
}

var forms = []form{
	{1, time.Second, 0}, {10, time.Second, 0}, {100, 3 * time.Second, 0}, {7, 90 * time.Minute, 0},
	{1, time.Second, 1}, {10, time.Second, 10}, {100, 3 * time.Second, 4}, {7, 90 * time.Minute, 60},
	{1000, time.Second, 1000},
}

// TestMaxLimit runs the largest limit through a burst, a denial and its
// exact RetryAfter (the conformance suite would take 16M calls).
func TestMaxLimit(t *testing.T) {
	for _, f := range []form{{slidingwindow.MaxLimit, time.Second, 0}, {slidingwindow.MaxLimit, time.Second, 1000}} {
		clk := throttletest.NewClock()
		w := f.window1(t, throttle.WithClock(clk))
		clk.Advance(time.Second / 2)
		for _, n := range []int{f.limit - 1, 1} {
			if d, _ := w.AllowN(n); !d.Allowed {
				t.Fatalf("%v: AllowN(%d) denied: %+v", f, n, d)
			}
		}
		d, _ := w.AllowN(f.limit)
		if d.Allowed || d.Remaining != 0 {
			t.Fatalf("%v: full window admitted: %+v", f, d)
		}
		clk.Advance(d.RetryAfter - 1)
		if d, _ := w.AllowN(f.limit); d.Allowed {
			t.Fatalf("%v: admitted 1ns before RetryAfter", f)
		}
		clk.Advance(1)
		if d, _ := w.AllowN(f.limit); !d.Allowed {
			t.Fatalf("%v: denied at RetryAfter: %+v", f, d)
		}
	}
}

func TestConformance(t *testing.T) {
	for _, f := range forms {
		s := throttletest.Suite{Limit: f.limit, Bound: f.bound}
		limitertest.Conformance(t, f.String(), s, limitertest.Slotted(f.slots, slidingwindow.NewWindow, slidingwindow.NewSlottedWindow), limitertest.Slotted(f.slots, slidingwindow.New, slidingwindow.NewSlotted), f.limit, f.window)
	}
}

func TestConstructorErrors(t *testing.T) {
	cases := []struct {
		name   string
		limit  int
		window time.Duration
		slots  int
		opts   []throttle.Option
	}{
		{"limit=0", 0, time.Second, 10, nil},
		{"limit<0", -1, time.Second, 10, nil},
		{"limit>Max", slidingwindow.MaxLimit + 1, time.Second, 10, nil},
		{"window=0", 10, 0, 10, nil},
		{"window<0", 10, -time.Second, 10, nil},
		{"window>Max", 10, slidingwindow.MaxWindow + 1, 10, nil},
		{"nil option", 10, time.Second, 10, []throttle.Option{nil}},
		{"nil clock", 10, time.Second, 10, []throttle.Option{throttle.WithClock(nil)}},
	}
	for _, c := range cases {
		if _, err := slidingwindow.NewWindow(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewWindow %s: err = %v, want ErrInvalid", c.name, err)
		}
		if l, err := slidingwindow.New(c.limit, c.window, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New %s: err = %v, want ErrInvalid", c.name, err)
			l.Close()
		}
	}
	cases = append(cases, []struct {
		name   string
		limit  int
		window time.Duration
		slots  int
		opts   []throttle.Option
	}{
		{"slots=0", 10, time.Second, 0, nil},
		{"slots<0", 10, time.Second, -4, nil},
		{"slots>Max", 10, time.Hour, slidingwindow.MaxSlots + 1, nil},
		{"window%slots!=0", 10, time.Second, 7, nil},
		{"slots>window ns", 10, 5, 10, nil},
	}...)
	for _, c := range cases {
		if _, err := slidingwindow.NewSlottedWindow(c.limit, c.window, c.slots, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewSlottedWindow %s: err = %v, want ErrInvalid", c.name, err)
		}
		if l, err := slidingwindow.NewSlotted(c.limit, c.window, c.slots, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewSlotted %s: err = %v, want ErrInvalid", c.name, err)
			l.Close()
		}
	}
	if _, err := slidingwindow.NewSlottedWindow(10, 1<<16, slidingwindow.MaxSlots); err != nil {
		t.Errorf("maxSlots of 1ns: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	for _, f := range []form{{5, time.Second, 0}, {5, time.Second, 5}} {
		w := f.window1(t)
		for _, c := range []struct {
			n    int
			want error
		}{{0, throttle.ErrInvalid}, {-3, throttle.ErrInvalid}, {6, throttle.ErrExceedsLimit}} {
			if _, err := w.AllowN(c.n); !errors.Is(err, c.want) {
				t.Errorf("%v: AllowN(%d): err = %v, want %v", f, c.n, err, c.want)
			}
		}
	}
	limitertest.ZeroValues(t, new(slidingwindow.Window), new(slidingwindow.Limiter))
}

type step = throttletest.Step

func admittedAt(ds []throttle.Decision, trace []step) (times []time.Duration, total int) {
	var at time.Duration
	for i, d := range ds {
		at += trace[i].Advance
		if d.Allowed {
			times = append(times, at)
			total += trace[i].N
		}
	}
	return times, total
}

// TestWeightedWorstCase builds the trace that reaches the documented
// bound of 2·limit-1 units in one window length: limit units in the last
// nanosecond of a window, then limit-1 two nanoseconds before the end of
// the next, within (t-W, t].
func TestWeightedWorstCase(t *testing.T) {
	const limit, win = 100, time.Second
	clk := throttletest.NewClock() // on a second boundary
	w := form{limit, win, 0}.window1(t, throttle.WithClock(clk))
	ds := throttletest.Replay(t, w, clk, "k", []step{
		{Advance: win - 1, N: limit}, // last ns of window 0
		{Advance: 1, N: 1},           // first ns of window 1: the estimate is still limit
		{Advance: win - 2, N: limit}, // 2ns before the end of window 1: estimate 100·2/1e9 → 1
		{Advance: 0, N: limit - 1},
		{Advance: 0, N: 1},
	})
	want := []bool{true, false, false, true, false}
	for i, d := range ds {
		if d.Allowed != want[i] {
			t.Fatalf("step %d: %+v, want allowed=%v", i, d, want[i])
		}
	}
	// The units at W-1 and 2W-2 are 1ns less than W apart: 2·limit-1 in
	// one window length.
	if d := ds[1]; d.RetryAfter != time.Duration(int64(win)/limit) {
		// One unit fits when 100·(W-e)/W ≤ 99, at e = W/100.
		t.Fatalf("first-ns denial RetryAfter %v, want %v", d.RetryAfter, win/limit)
	}
}

// TestClassicAttack replays the fixed window's boundary attack (limit at
// the end of a window, limit at the start of the next) on both forms.
func TestClassicAttack(t *testing.T) {
	const limit, win = 100, time.Minute
	var trace []step
	trace = append(trace, step{Advance: win - 1, N: 0}) // placeholder for the position
	trace[0] = step{Advance: win - 1, N: 1}
	for range limit - 1 {
		trace = append(trace, step{Advance: 0, N: 1})
	}
	trace = append(trace, step{Advance: 1, N: 1})
	for range limit {
		trace = append(trace, step{Advance: 0, N: 1})
	}
	for _, c := range []struct {
		f    form
		want int
	}{
		{form{limit, win, 0}, limit},     // the first ns of the next window still counts all 100
		{form{limit, win, 1}, 2 * limit}, // one slot: a fixed window
		{form{limit, win, 60}, limit},
	} {
		clk := throttletest.NewClock()
		w := c.f.window1(t, throttle.WithClock(clk))
		_, got := admittedAt(throttletest.Replay(t, w, clk, "k", trace), trace)
		if got != c.want {
			t.Errorf("%v: admitted %d, want %d", c.f, got, c.want)
		}
	}
}

// TestSlottedErrorShrinksWithSlots measures the slotted form's error: with
// limit units at the end of the first slot, the next limit units pass only
// once that slot has left the window, W - W/k + 1ns later. So 2·limit
// units need a span of more than W - W/k, and the span grows toward W as k
// grows (k = 1 is a fixed window: 1ns).
func TestSlottedErrorShrinksWithSlots(t *testing.T) {
	const limit, win = 10, time.Second
	for _, k := range []int{1, 2, 4, 10, 100, 1000} {
		clk := throttletest.NewClock()
		w := form{limit, win, k}.window1(t, throttle.WithClock(clk))
		slot := win / time.Duration(k)
		clk.Advance(slot - 1)
		if d, _ := w.AllowN(limit); !d.Allowed {
			t.Fatalf("k=%d: first burst denied", k)
		}
		d, _ := w.AllowN(limit)
		if d.Allowed || d.RetryAfter != win-slot+1 {
			t.Fatalf("k=%d: second burst %+v, want denied with RetryAfter %v", k, d, win-slot+1)
		}
		clk.Advance(d.RetryAfter - 1)
		if d, _ := w.AllowN(1); d.Allowed {
			t.Fatalf("k=%d: admitted before the first slot left", k)
		}
		clk.Advance(1)
		if d, _ := w.AllowN(limit); !d.Allowed {
			t.Fatalf("k=%d: second burst denied at RetryAfter", k)
		}
	}
}

// TestSteadyOverRate sends 2·limit requests per window, evenly spaced.
// The slotted form (10 slots, one request every half slot) admits exactly
// limit per window, like an exact log: each request replaces the one a
// window earlier. The weighted form admits limit in the first window and
// then limit-1 per window: on this grid the estimate at the last request
// of each window is 0.45 + 9 + 1 > 10.
func TestSteadyOverRate(t *testing.T) {
	const limit, win = 10, time.Second
	trace := make([]step, 20*2*limit)
	for i := range trace {
		trace[i] = step{Advance: win / (2 * limit), N: 1}
	}
	for _, c := range []struct {
		f         form
		perWindow []int // admitted in windows 0, 1, 2, ... (the last request is at 20s)
	}{
		{form{limit, win, 10}, []int{10, 10, 10}},
		{form{limit, win, 0}, []int{10, 9, 9}},
	} {
		clk := throttletest.NewClock()
		w := c.f.window1(t, throttle.WithClock(clk))
		times, _ := admittedAt(throttletest.Replay(t, w, clk, "k", trace), trace)
		per := make([]int, 21)
		for _, at := range times {
			per[at/win]++
		}
		for i := range 20 {
			want := c.perWindow[min(i, len(c.perWindow)-1)]
			if per[i] != want {
				t.Fatalf("%v: window %d admitted %d, want %d (all: %v)", c.f, i, per[i], want, per)
			}
		}
	}
	// The weighted pattern in window 1: prev = 10, so the request at e
	// passes when ⌈10·(1-e)⌉ + cur + 1 ≤ 10: at e = 100ms, 200ms, ..., 900ms.
	clk := throttletest.NewClock()
	w := form{limit, win, 0}.window1(t, throttle.WithClock(clk))
	times, _ := admittedAt(throttletest.Replay(t, w, clk, "k", trace[:40]), trace[:40])
	var got []time.Duration
	for _, at := range times {
		if at >= win && at < 2*win {
			got = append(got, at-win)
		}
	}
	want := []time.Duration{100, 200, 300, 400, 500, 600, 700, 800, 900}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("weighted window 1 admitted at %v, want %v", got, want)
	}
}

// TestBurstyOnOff sends bursts of 3·limit requests in one instant. After
// an idle gap of two windows both forms are empty and admit exactly limit
// per burst; bursts one window apart are what tells them apart.
func TestBurstyOnOff(t *testing.T) {
	const limit, win = 10, time.Second
	burst := func(gap time.Duration) []step {
		s := []step{{Advance: gap, N: 1}}
		for range 3*limit - 1 {
			s = append(s, step{Advance: 0, N: 1})
		}
		return s
	}
	for _, c := range []struct {
		gap  time.Duration
		f    form
		want []int // admitted per burst
	}{
		{2 * win, form{limit, win, 0}, []int{10, 10, 10, 10}},
		{2 * win, form{limit, win, 10}, []int{10, 10, 10, 10}},
		// Bursts at 1s, 2s, 3s: each starts a window, and the previous
		// window holds limit at weight 1: the weighted form admits nothing
		// until the previous window's weight decays.
		{win, form{limit, win, 0}, []int{10, 0, 10, 0}},
		// The slotted form frees the burst a window later, at the slot
		// boundary: the burst at exactly W later is admitted.
		{win, form{limit, win, 10}, []int{10, 10, 10, 10}},
		// Bursts 1.5 windows apart (at 1.5s, 3s, 4.5s, 6s): weighted at e
		// = 0.5 of the next-but-one window...
		{win * 3 / 2, form{limit, win, 0}, []int{10, 10, 5, 10}},
		{win * 3 / 2, form{limit, win, 10}, []int{10, 10, 10, 10}},
	} {
		clk := throttletest.NewClock()
		w := c.f.window1(t, throttle.WithClock(clk))
		for b, want := range c.want {
			trace := burst(c.gap)
			_, got := admittedAt(throttletest.Replay(t, w, clk, "k", trace), trace)
			if got != want {
				t.Errorf("%v, gap %v: burst %d admitted %d, want %d", c.f, c.gap, b, got, want)
			}
		}
	}
}

func TestKeyedRetiresEmptyWindows(t *testing.T) {
	for _, f := range []form{{3, time.Second, 0}, {3, time.Second, 10}} {
		clk := throttletest.NewClock()
		l := f.keyed(t, throttle.WithClock(clk), throttle.WithMaxKeys(1<<12))
		for i := range 5000 {
			clk.Advance(time.Millisecond)
			if d, err := l.Allow(t.Context(), fmt.Sprint("k", i), 1); err != nil || !d.Allowed {
				t.Fatalf("%v: key %d: %+v, %v", f, i, d, err)
			}
		}
		// A key is dropped lazily once empty (2 windows after its hit) and
		// past the map's retire margin: about 3000 of the 5000 stay.
		if n := l.Len(); n > 4000 {
			t.Fatalf("%v: %d keys kept", f, n)
		}
	}
}

// TestStress hammers one key from many goroutines while the clock moves,
// then checks the bounds from the decisions. The window (weighted) or slot
// (slotted) of each admission is recovered from its ResetAfter, which is
// measured from the end of it: now+ResetAfter is 2 windows after the
// window's start, or k slots after the slot's start, and now lies between
// the clock readings taken around the call, less than a quarter slot apart.
func TestStress(t *testing.T) {
	for _, f := range []form{{50, time.Millisecond, 0}, {50, time.Millisecond, 10}, {50, time.Millisecond, 1}, {20, time.Millisecond, 5}} {
		for _, keyed := range []bool{false, true} {
			clk := throttletest.NewClock()
			var l throttle.Limiter
			if keyed {
				l = f.keyed(t, throttle.WithClock(clk))
			} else {
				l = f.window1(t, throttle.WithClock(clk))
			}
			unit, span := int64(f.window), int64(2) // weighted: window, 2 windows
			if f.slots > 0 {
				unit, span = int64(f.window)/int64(f.slots), int64(f.slots)
			}
			var mu sync.Mutex
			count := map[int64]int64{} // admitted per window or slot
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					mine := map[int64]int64{}
					for i := range 3000 {
						switch {
						case i%500 == 499:
							clk.Advance(time.Duration(3 * unit)) // skip slots
						case i%10 == 0:
							clk.Advance(time.Duration(unit / 20))
						}
						n := 1 + i%3
						before := clk.Now().UnixNano()
						d, err := l.Allow(t.Context(), "hot", n)
						after := clk.Now().UnixNano()
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed && after-before < unit/4 {
							end := before + int64(d.ResetAfter)
							mine[(end+unit-1)/unit-span] += int64(n)
						}
					}
					mu.Lock()
					for k, v := range mine {
						count[k] += v
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			var idx []int64
			for k := range count {
				idx = append(idx, k)
			}
			sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
			var total int64
			for _, v := range count {
				total += v
			}
			if len(idx) < 5 || total < 5*int64(f.limit) {
				t.Fatalf("%v keyed=%v: only %d units in %d windows or slots; the stress did not stress", f, keyed, total, len(idx))
			}
			// Every aligned window (weighted) or every k consecutive slots
			// (slotted) hold at most limit.
			per := int64(1)
			if f.slots > 0 {
				per = int64(f.slots)
			}
			for _, first := range idx {
				var sum int64
				for m := first; m < first+per; m++ {
					sum += count[m]
				}
				if sum > int64(f.limit) {
					t.Fatalf("%v keyed=%v: %d units in %d slot(s) from %d, limit %d", f, keyed, sum, per, first, f.limit)
				}
			}
		}
	}
}

func ExampleNew() {
	clk := throttletest.NewClock() // a virtual clock; omit WithClock in real use
	l, err := slidingwindow.New(4, time.Minute, throttle.WithClock(clk))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	clk.Advance(30 * time.Second) // half way through a window
	d, _ := l.Allow(ctx, "client-42", 4)
	fmt.Println(d.Allowed, d.Remaining)
	clk.Advance(45 * time.Second) // a quarter into the next: the 4 weigh 3
	d, _ = l.Allow(ctx, "client-42", 2)
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	d, _ = l.Allow(ctx, "client-42", 1)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 0
	// false 1 15s
	// true 0
}

func ExampleNewSlotted() {
	clk := throttletest.NewClock()
	l, err := slidingwindow.NewSlotted(3, time.Minute, 6, throttle.WithClock(clk)) // 10s slots
	if err != nil {
		panic(err)
	}
	defer l.Close()
	ctx := context.Background()
	l.Allow(ctx, "k", 2)
	clk.Advance(25 * time.Second)
	d, _ := l.Allow(ctx, "k", 2)
	fmt.Println(d.Allowed, d.RetryAfter) // the 2 units of slot 0 leave at 60s
	// Output:
	// false 35s
}
