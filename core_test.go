package throttle_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"
	"github.com/throttlekit/throttle/internal/limiterkit"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A copy of a Reservation shares its booking: cancelling both refunds once.
func TestReservationCopiesCancelOnce(t *testing.T) {
	var refunds int
	r := limiterkit.NewReservation(time.Second, 3, func() { refunds++ })
	c := r
	r.Cancel()
	c.Cancel()
	r.Cancel()
	if refunds != 1 {
		t.Fatalf("refunds = %d, want 1", refunds)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	r = limiterkit.NewReservation(0, 1, func() { mu.Lock(); n++; mu.Unlock() })
	for range 8 {
		wg.Go(func() { c := r; c.Cancel() })
	}
	wg.Wait()
	if n != 1 {
		t.Fatalf("concurrent cancels refunded %d times", n)
	}
	var zero throttle.Reservation
	zero.Cancel() // no-op
}

// Wrap over a concurrency limit releases what each call holds: 5 calls in a
// row on a limit of 3 all run (before Holder, 3 ran and then none ever).
func TestWrapReleasesHeldUnits(t *testing.T) {
	l, err := counting.New(3)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f := throttle.Wrap(l, "k", func(context.Context) (int, error) { return 1, nil })
	for i := range 5 {
		if _, err := f(context.Background()); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := l.InFlight("k"); got != 0 {
		t.Fatalf("in flight after the calls: %d", got)
	}
	// Blocking wrap holds too, and releases on panic.
	g := throttle.Wrap(l, "k", func(context.Context) (int, error) { panic("boom") }, throttle.Blocking())
	func() {
		defer func() { _ = recover() }()
		_, _ = g(context.Background())
	}()
	if got := l.InFlight("k"); got != 0 {
		t.Fatalf("in flight after a panic: %d", got)
	}
}

func TestTryHold(t *testing.T) {
	l, _ := counting.New(1)
	defer l.Close()
	ctx := context.Background()
	d, release, err := throttle.TryHold(ctx, l, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if d, rel2, _ := throttle.TryHold(ctx, l, "k", 1); d.Allowed {
		t.Fatal("second unit admitted over a limit of 1")
	} else {
		rel2() // a no-op, never nil
	}
	release()
	release()
	if l.InFlight("k") != 0 {
		t.Fatal("release did not give the unit back")
	}
	b, _ := tokenbucket.NewBucket(throttle.PerSecond(1), 1)
	if d, rel, err := throttle.TryHold(ctx, b, "", 1); err != nil || !d.Allowed || rel == nil {
		t.Fatal(d, err)
	}
}

func TestObserveKeepsAbilities(t *testing.T) {
	b, _ := tokenbucket.New(throttle.PerSecond(1), 2)
	defer b.Close()
	c, _ := counting.New(1)
	defer c.Close()
	if throttle.Observe(b, "x", nil) != throttle.Limiter(b) {
		t.Fatal("a nil observer must return the limiter itself")
	}
	rec := &reporttest.Recorder{}
	ob := throttle.Observe(b, "api", rec)
	if _, ok := ob.(throttle.Reserver); !ok {
		t.Fatal("observed token bucket lost Reserve")
	}
	if _, ok := ob.(throttle.Holder); ok {
		t.Fatal("observed token bucket claims to hold")
	}
	oc := throttle.Observe(c, "jobs", rec)
	h, ok := oc.(throttle.Holder)
	if !ok {
		t.Fatal("observed counting limiter lost TryHold")
	}
	if _, ok := oc.(throttle.QuotaReporter); !ok {
		t.Fatal("observed counting limiter lost Quota")
	}
	ctx := context.Background()
	for range 3 {
		_, _ = ob.Allow(ctx, "k", 1)
	}
	_, _ = ob.Allow(ctx, "", 1)
	_, release, _ := h.TryHold(ctx, "k", 1)
	release()
	release() // a second call gives back nothing and reports nothing
	events := rec.Events()
	if len(events) != 6 {
		t.Fatalf("%d events, want 6", len(events))
	}
	allowed, denied, errs := 0, 0, 0
	for _, e := range events[:4] {
		switch {
		case e.Kind == throttle.EventError:
			errs++
			if !errors.Is(e.Err, throttle.ErrInvalid) || e.Limiter != "api" {
				t.Errorf("error event %+v", e)
			}
		case e.Decision.Allowed:
			allowed++
		default:
			denied++
		}
	}
	if allowed != 2 || denied != 1 || errs != 1 {
		t.Fatalf("allowed %d denied %d errors %d", allowed, denied, errs)
	}
	if e := events[4]; e.Limiter != "jobs" || !e.Decision.Allowed || !e.Held {
		t.Fatalf("hold event %+v", e)
	}
	if e := events[5]; e.Kind != throttle.EventRelease || e.Limiter != "jobs" || e.N != 1 || c.InFlight("k") != 0 {
		t.Fatalf("release event %+v, %d in flight", e, c.InFlight("k"))
	}
}

// timing observes calls and asks Observe to time them.
type timing struct{ reporttest.Recorder }

func (*timing) ObservesLatency() bool { return true }

func TestObserveTimesCallsForAnObserverThatAsks(t *testing.T) {
	slow := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		time.Sleep(2 * time.Millisecond)
		return throttle.Decision{Allowed: true}, nil
	})
	rec := &timing{}
	_, _ = throttle.Observe(slow, "store", rec).Allow(context.Background(), "k", 1)
	plain := &reporttest.Recorder{}
	_, _ = throttle.Observe(slow, "store", plain).Allow(context.Background(), "k", 1)
	if timed, untimed := rec.Events()[0].Latency, plain.Events()[0].Latency; timed < 2*time.Millisecond || untimed != 0 {
		t.Fatalf("latency %v with an Observer asking for latency, %v without", timed, untimed)
	}
}

type nopObserver struct{}

func (nopObserver) Observe(throttle.Event) {}

// BenchmarkObserve shows that an observer that keeps nothing allocates
// nothing, and an unset one costs nothing (Observe returns the limiter).
func BenchmarkObserve(b *testing.B) {
	l, _ := tokenbucket.NewBucket(throttle.PerSecond(1e9), 1<<30)
	for _, bc := range []struct {
		name string
		o    throttle.Observer
	}{{"unset", nil}, {"nop", nopObserver{}}} {
		ol := throttle.Observe(l, "b", bc.o)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				_, _ = ol.Allow(ctx, "", 1)
			}
		})
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	l, _ := tokenbucket.NewBucket(throttle.PerSecond(1e9), 1<<30)
	ol := throttle.Observe(l, "b", nopObserver{})
	ctx := context.Background()
	if a := testing.AllocsPerRun(100, func() { _, _ = ol.Allow(ctx, "", 1) }); a != 0 {
		t.Fatalf("%v allocs per observed Allow", a)
	}
}

func TestSmallErrors(t *testing.T) {
	l, _ := counting.New(1)
	tb, _ := tokenbucket.New(throttle.PerSecond(1), 1)
	l.Close()
	tb.Close()
	for _, lim := range []throttle.Limiter{l, tb} {
		_, err := lim.Allow(context.Background(), "k", 1)
		if !errors.Is(err, throttle.ErrClosed) || strings.Count(err.Error(), "throttle:") != 1 {
			t.Errorf("closed limiter: %q", err)
		}
	}
	if _, err := throttle.ParseRate("99999999999999999999/s"); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("ParseRate of a huge count: %v", err)
	}
	if err := throttle.NewRate(2, 2*bridge.MaxPeriod+1).Validate(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("NewRate(2, 2·MaxPeriod+1ns).Validate() = %v", err)
	}
	if err := throttle.NewRate(2, 2*bridge.MaxPeriod).Validate(); err != nil {
		t.Errorf("NewRate(2, 2·MaxPeriod).Validate() = %v", err)
	}
}

func TestQuota(t *testing.T) {
	must := func(l any, err error) throttle.QuotaReporter {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := l.(interface{ Close() error }); ok {
			t.Cleanup(func() { c.Close() })
		}
		return l.(throttle.QuotaReporter)
	}
	tb, err := tokenbucket.New(throttle.PerSecond(10), 20)
	for _, c := range []struct {
		name string
		q    throttle.QuotaReporter
		want throttle.Quota
	}{
		{"tokenbucket keyed", must(tb, err), throttle.Quota{Limit: 20, Window: 2 * time.Second}},
		{"tokenbucket", must(tokenbucket.NewBucket(throttle.NewRate(1, time.Minute), 5)), throttle.Quota{Limit: 5, Window: 5 * time.Minute}},
		{"leakybucket", must(leakybucket.New(throttle.PerSecond(4), 2)), throttle.Quota{Limit: 2, Window: 500 * time.Millisecond}},
		{"pacer", must(leakybucket.NewPacer(throttle.PerSecond(10), 4, time.Second)), throttle.Quota{Limit: 5, Window: 500 * time.Millisecond}},
		{"fixedwindow", must(fixedwindow.New(100, time.Minute)), throttle.Quota{Limit: 100, Window: time.Minute}},
		{"fixedwindow anchored", must(fixedwindow.NewAnchoredWindow(3, time.Hour)), throttle.Quota{Limit: 3, Window: time.Hour}},
		{"slidingwindow", must(slidingwindow.New(7, time.Second)), throttle.Quota{Limit: 7, Window: time.Second}},
		{"slidingwindow slotted", must(slidingwindow.NewSlotted(7, time.Second, 10)), throttle.Quota{Limit: 7, Window: time.Second}},
		{"slidinglog", must(slidinglog.New(9, time.Minute)), throttle.Quota{Limit: 9, Window: time.Minute}},
		{"counting", must(counting.New(3)), throttle.Quota{Limit: 3}},
	} {
		if got := c.q.Quota(); got != c.want {
			t.Errorf("%s: Quota() = %+v, want %+v", c.name, got, c.want)
		}
	}
	// Quota follows runtime changes.
	_ = tb.SetBurst(40)
	if got := tb.Quota(); got != (throttle.Quota{Limit: 40, Window: 4 * time.Second}) {
		t.Errorf("after SetBurst(40): %+v", got)
	}
	var zero fixedwindow.Window
	if zero.Quota() != (throttle.Quota{}) {
		t.Error("zero Window reports a quota")
	}
}

// TestSingleResourceRejectsKeyedOptions: a limiter of one resource has no
// keys, so an option that bounds keys is a mistake to report, not to
// ignore. The clock is still taken.
func TestSingleResourceRejectsKeyedOptions(t *testing.T) {
	r := throttle.PerSecond(10)
	singles := map[string]func(...throttle.Option) error{
		"tokenbucket.NewBucket":   func(o ...throttle.Option) error { _, err := tokenbucket.NewBucket(r, 10, o...); return err },
		"leakybucket.NewBucket":   func(o ...throttle.Option) error { _, err := leakybucket.NewBucket(r, 10, o...); return err },
		"leakybucket.NewPacer":    func(o ...throttle.Option) error { _, err := leakybucket.NewPacer(r, 1, time.Second, o...); return err },
		"fixedwindow.NewWindow":   func(o ...throttle.Option) error { _, err := fixedwindow.NewWindow(10, time.Second, o...); return err },
		"slidingwindow.NewWindow": func(o ...throttle.Option) error { _, err := slidingwindow.NewWindow(10, time.Second, o...); return err },
		"slidinglog.NewLog":       func(o ...throttle.Option) error { _, err := slidinglog.NewLog(10, time.Second, o...); return err },
	}
	keyed := []throttle.Option{throttle.WithMaxKeys(5), throttle.WithMaxKeyLen(5), throttle.WithSweepInterval(time.Second)}
	for name, build := range singles {
		for _, o := range keyed {
			if err := build(o); !errors.Is(err, throttle.ErrInvalid) {
				t.Errorf("%s with a keyed option: %v, want ErrInvalid", name, err)
			}
		}
		var clk throttle.Clock = throttletest.NewClock()
		if err := build(throttle.WithClock(clk)); err != nil {
			t.Errorf("%s WithClock: %v", name, err)
		}
		if err := build(throttle.WithClock(nil)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s WithClock(nil): %v, want ErrInvalid", name, err)
		}
	}
}
