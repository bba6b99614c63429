package adaptive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

var bg = context.Background()

// fixed is an Algorithm that keeps the limit, or sets it to to when to is
// positive; it records the windows it saw.
type fixed struct {
	to   float64
	seen []Window
}

func (f *fixed) Update(limit float64, w Window) float64 {
	f.seen = append(f.seen, w)
	if f.to > 0 {
		return f.to
	}
	return limit
}

func mustNew(t testing.TB, alg Algorithm, c Config, clk throttle.Clock) *Limiter {
	t.Helper()
	var opts []throttle.Option
	if clk != nil {
		opts = append(opts, throttle.WithClock(clk))
	}
	l, err := New(alg, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestConfigInvalid(t *testing.T) {
	for _, c := range []Config{{Min: -1}, {Min: 5, Max: 4}, {Initial: 2000}, {Max: maxLimit + 1}, {Window: -1}, {WindowSamples: -1}, {Timeout: -time.Second}} {
		if _, err := New(&AIMD{}, c); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if _, err := New(nil, Config{}); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
}

func TestAllowRelease(t *testing.T) {
	l := mustNew(t, &fixed{}, Config{Initial: 2}, nil)
	for i, want := range []bool{true, true, false} {
		d, err := l.Allow(bg, "", 1)
		if err != nil || d.Allowed != want || d.Limit != 2 {
			t.Fatalf("Allow #%d = %+v, %v; want allowed %v, limit 2", i, d, err, want)
		}
	}
	if err := l.Release(3, time.Millisecond, Success); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Release of 3 with 2 held = %v, want ErrInvalid", err)
	}
	if err := l.Release(1, time.Millisecond, Success); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(bg, "", 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Allow after Release = %+v", d)
	}
	if _, err := l.Allow(bg, "", 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Allow(0) = %v", err)
	}
	if _, err := l.Allow(bg, "", 1001); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("Allow above Max = %v", err)
	}
}

// TestWindow checks what a closed window holds: successes, drops, the
// mean and least RTT, the peak in flight, Timeout turning slow successes
// into drops, and that Ignored is no sample.
func TestWindow(t *testing.T) {
	clk := throttletest.NewClock()
	f := &fixed{to: 7}
	l := mustNew(t, f, Config{Initial: 10, Window: time.Second, WindowSamples: 4, Timeout: 50 * time.Millisecond}, clk)
	for range 5 {
		l.Allow(bg, "", 1)
	}
	l.Release(1, 10*time.Millisecond, Success)
	l.Release(1, 30*time.Millisecond, Success)
	l.Release(1, 90*time.Millisecond, Success) // slower than Timeout: a drop
	l.Release(1, time.Millisecond, Ignored)
	clk.Advance(time.Second)
	l.Release(1, 0, Dropped)
	want := Window{Samples: 2, Dropped: 2, AvgRTT: 20 * time.Millisecond, MinRTT: 10 * time.Millisecond, MaxInFlight: 5}
	if len(f.seen) != 1 || f.seen[0] != want {
		t.Fatalf("windows %+v, want [%+v]", f.seen, want)
	}
	if l.Limit() != 7 {
		t.Fatalf("Limit = %d, want 7", l.Limit())
	}
	// Too few samples: the window stays open however long it is.
	l.Allow(bg, "", 1)
	clk.Advance(time.Hour)
	l.Release(1, time.Millisecond, Success)
	if len(f.seen) != 1 {
		t.Fatalf("a window of 1 sample closed: %+v", f.seen)
	}
}

// TestWindowCloseLate holds the promise of sample: a window due by time
// closes within 8 samples while it holds fewer than 1024, and within 64
// once it holds more.
func TestWindowCloseLate(t *testing.T) {
	for _, c := range []struct{ before, late int }{{20, lateSmall}, {100, lateSmall}, {1000, lateSmall}, {1024, lateLarge}, {5000, lateLarge}} {
		clk := throttletest.NewClock()
		f := &fixed{}
		l := mustNew(t, f, Config{Initial: 1000, Max: 1000, Window: time.Second}, clk)
		release := func() {
			l.Allow(bg, "", 1)
			l.Release(1, time.Millisecond, Success)
		}
		for range c.before {
			release()
		}
		clk.Advance(time.Second)
		n := 0
		for len(f.seen) == 0 && n <= c.late {
			release()
			n++
		}
		if len(f.seen) != 1 || n > c.late {
			t.Errorf("window of %d samples due by time: closed after %d more (windows %d), want at most %d",
				c.before, n, len(f.seen), c.late)
		}
	}
}

// TestHeldNeverAboveLimit races TryHold and release from many goroutines
// on a limit of 8 and checks, from the callers' side, that no more than
// 8 units are ever held.
func TestHeldNeverAboveLimit(t *testing.T) {
	l := mustNew(t, &fixed{}, Config{Initial: 8, Window: time.Nanosecond, WindowSamples: 1}, nil)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 2000 {
				d, release, err := l.TryHold(bg, "", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				h := held.Add(1)
				for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
				}
				held.Add(-1)
				release()
				release() // only the first counts
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 8 {
		t.Fatalf("%d units held at once, limit 8", p)
	}
	if n := l.InFlight(); n != 0 {
		t.Fatalf("InFlight = %d after every release", n)
	}
}

// TestHold: a waiter is woken by a release and by a rising limit, and
// gives up with its context.
func TestHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fixed{}
		l := mustNew(t, f, Config{Initial: 1, WindowSamples: 1}, nil)
		release, err := l.Hold(bg, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan func())
		wait := func() { // a waiter for one unit, parked
			go func() {
				r, err := l.Hold(bg, "", 1)
				if err != nil {
					t.Error(err)
				}
				got <- r
			}()
			synctest.Wait()
		}
		wait()
		select {
		case <-got:
			t.Fatal("Hold returned while the unit was held")
		default:
		}
		time.Sleep(time.Second)
		release()
		r2 := <-got

		// The limit rises: a waiter gets in without a release.
		wait()
		f.to = 2
		time.Sleep(time.Second)
		r2() // closes a window: the limit becomes 2, and the unit is free too
		(<-got)()

		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		hold, _ := l.Hold(bg, "", 2)
		if _, err := l.Hold(ctx, "", 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Hold past its deadline = %v", err)
		}
		hold()
	})
}

// TestReleaseOutcomeFromContext: TryHold's release reports a context past
// its deadline as a drop and a cancelled one as no sample.
func TestReleaseOutcomeFromContext(t *testing.T) {
	clk := throttletest.NewClock()
	f := &fixed{}
	l := mustNew(t, f, Config{Initial: 10, Window: time.Second, WindowSamples: 1}, clk)
	ctx, cancel := context.WithCancel(bg)
	_, r1, _ := l.TryHold(ctx, "", 1)
	cancel()
	dl, cancel2 := context.WithDeadline(bg, time.Unix(0, 0))
	defer cancel2()
	_, r2, _ := l.TryHold(dl, "", 1)
	_, r3, _ := l.TryHold(bg, "", 1)
	clk.Advance(2 * time.Second)
	r1()
	if len(f.seen) != 0 {
		t.Fatalf("a cancelled request was a sample: %+v", f.seen)
	}
	r2()
	r3()
	want := []Window{{Dropped: 1, MaxInFlight: 2}}
	if len(f.seen) != 1 || f.seen[0] != want[0] {
		t.Fatalf("windows %+v, want %+v", f.seen, want)
	}
}

func TestOutcomeOf(t *testing.T) {
	for err, want := range map[error]Outcome{
		nil:                                   Success,
		errors.New("not found"):               Success,
		context.Canceled:                      Ignored,
		context.DeadlineExceeded:              Dropped,
		throttle.ErrLimited:                   Ignored,
		throttle.ErrUnavailable:               Dropped,
		fmt.Errorf("waiting: %w", ErrNotSent): Ignored,
	} {
		if got := OutcomeOf(err); got != want {
			t.Errorf("OutcomeOf(%v) = %v, want %v", err, got, want)
		}
	}
}

// TestObserver: a change of the limit is reported as an EventLimit (the
// decisions beside it: TestEveryCallReported in internal/report).
func TestObserver(t *testing.T) {
	clk := throttletest.NewClock()
	var events []throttle.Event
	o := throttle.ObserverFunc(func(e throttle.Event) {
		if e.Kind == throttle.EventLimit {
			events = append(events, e)
		}
	})
	l := mustNew(t, &fixed{to: 5}, Config{Initial: 10, Window: time.Second, WindowSamples: 1, Name: "db", Observer: o}, clk)
	l.Allow(bg, "", 1)
	l.Allow(bg, "", 1)
	clk.Advance(time.Second)
	l.Release(1, 3*time.Millisecond, Success)
	if len(events) != 1 || events[0].Kind != throttle.EventLimit || events[0].Limiter != "db" ||
		events[0].Decision.Limit != 5 || events[0].N != 1 || events[0].Latency != 3*time.Millisecond {
		t.Fatalf("events %+v", events)
	}
}

func TestAllocs(t *testing.T) {
	if raceOn {
		t.Skip("allocations differ under the race detector")
	}
	clk := throttletest.NewClock()
	for _, alg := range []Algorithm{&AIMD{}, &Vegas{}, &Gradient2{}} {
		l := mustNew(t, alg, Config{Window: time.Nanosecond, WindowSamples: 1}, clk)
		if n := testing.AllocsPerRun(1000, func() {
			l.Allow(bg, "", 1)
			clk.Advance(time.Millisecond)
			l.Release(1, time.Millisecond, Success)
		}); n != 0 {
			t.Errorf("%T: %v allocs per Allow+Release", alg, n)
		}
	}
}

// TestClockStepsBack: an injected clock stepped back an hour does not
// freeze the limit until it catches up; the next due window closes.
func TestClockStepsBack(t *testing.T) {
	clk := throttletest.NewClock()
	f := &fixed{to: 7}
	l := mustNew(t, f, Config{Initial: 10, Window: time.Second, WindowSamples: 1}, clk)
	clk.Advance(-time.Hour)
	l.Allow(bg, "", 1)
	l.Release(1, time.Millisecond, Success)
	if len(f.seen) != 1 || l.Limit() != 7 {
		t.Fatalf("after the clock stepped back: %d windows, limit %d", len(f.seen), l.Limit())
	}
	// The window that opened at the stepped-back time runs its full length.
	l.Allow(bg, "", 1)
	l.Release(1, time.Millisecond, Success)
	if len(f.seen) != 1 {
		t.Fatal("a window closed before its length")
	}
}
