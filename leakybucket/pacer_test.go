package leakybucket_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

func newPacer(t testing.TB, r throttle.Rate, slack int, maxWait time.Duration, opts ...throttle.Option) *leakybucket.Pacer {
	t.Helper()
	p, err := leakybucket.NewPacer(r, slack, maxWait, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func reserve(t testing.TB, p *leakybucket.Pacer) time.Duration {
	t.Helper()
	d, err := p.Reserve()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestPacerReserve(t *testing.T) {
	clk := throttletest.NewClock()
	p := newPacer(t, throttle.PerSecond(10), 2, leakybucket.Unbounded, throttle.WithClock(clk))
	var got []time.Duration
	for range 5 {
		got = append(got, reserve(t, p))
	}
	ms := time.Millisecond
	if want := []time.Duration{0, 0, 0, 100 * ms, 200 * ms}; !slices.Equal(got, want) {
		t.Fatalf("fresh pacer, slack 2: delays %v, want %v", got, want)
	}
	clk.Advance(150 * ms) // slots up to 200ms are booked
	if d := reserve(t, p); d != 150*ms {
		t.Fatalf("delay %v, want 150ms", d)
	}
	clk.Advance(10 * time.Second) // idle: 2 missed slots may be caught up
	got = got[:0]
	for range 4 {
		got = append(got, reserve(t, p))
	}
	if want := []time.Duration{0, 0, 0, 100 * ms}; !slices.Equal(got, want) {
		t.Fatalf("after idle: delays %v, want %v", got, want)
	}
	if p.Slack() != 2 || p.Rate() != throttle.PerSecond(10) {
		t.Fatalf("Slack %d Rate %v", p.Slack(), p.Rate())
	}
}

func TestPacerMaxWait(t *testing.T) {
	clk := throttletest.NewClock()
	p := newPacer(t, throttle.PerSecond(10), 0, 250*time.Millisecond, throttle.WithClock(clk))
	for i, want := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond} {
		if d := reserve(t, p); d != want {
			t.Fatalf("Reserve %d: %v, want %v", i, d, want)
		}
	}
	for range 2 { // rejected, and nothing booked
		d, err := p.Reserve()
		if !errors.Is(err, throttle.ErrLimited) || d != 50*time.Millisecond {
			t.Fatalf("Reserve beyond maxWait: %v, %v; want ErrLimited, 50ms", d, err)
		}
		if err := p.Take(t.Context()); !errors.Is(err, throttle.ErrLimited) {
			t.Fatalf("Take beyond maxWait: %v", err)
		}
	}
	clk.Advance(50 * time.Millisecond)
	if d := reserve(t, p); d != 250*time.Millisecond {
		t.Fatalf("Reserve at maxWait exactly: %v", d)
	}
	// maxWait 0: only immediate slots.
	p = newPacer(t, throttle.PerSecond(10), 0, 0, throttle.WithClock(clk))
	if err := p.Take(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := p.Take(t.Context()); !errors.Is(err, throttle.ErrLimited) {
		t.Fatalf("second Take with maxWait 0: %v", err)
	}
}

func TestPacerErrors(t *testing.T) {
	for _, c := range []struct {
		rate    throttle.Rate
		slack   int
		maxWait time.Duration
	}{
		{throttle.Rate{}, 0, 0},
		{throttle.PerSecond(1), -1, 0},
		{throttle.PerSecond(1), 0, -1},
		{throttle.NewRate(1, bridge.MaxPeriod), 100, 0},
	} {
		if _, err := leakybucket.NewPacer(c.rate, c.slack, c.maxWait); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewPacer(%v, %d, %v): %v", c.rate, c.slack, c.maxWait, err)
		}
	}
	var p leakybucket.Pacer
	if _, err := p.Reserve(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Pacer Reserve: %v", err)
	}
	if err := p.Take(t.Context()); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Pacer Take: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := newPacer(t, throttle.PerSecond(1), 0, 0).Take(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Take on a done ctx: %v", err)
	}
}

// TestPacerTakeSynctest runs Take on the bubble's virtual time, with the
// default (system) clock: 10 goroutines at once get slots exactly 100 ms
// apart.
// TestPacerEndOfTime: a Pacer at one slot per 366 days in 2200 hands out
// ever later slots until the next would pass 2262, then refuses with an
// error wrapping ErrInvalid (it used to hand out delay 0 after delays of
// 544,608 h).
func TestPacerEndOfTime(t *testing.T) {
	year := 366 * 24 * time.Hour
	clk := throttletest.NewClock()
	clk.Set(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newPacer(t, throttle.NewRate(1, year), 0, leakybucket.Unbounded, throttle.WithClock(clk))
	last, slots := time.Duration(-1), 0
	for range 100 {
		d, err := p.Reserve()
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("after %d slots: %v, want an error wrapping ErrInvalid", slots, err)
			}
			break
		}
		if d <= last {
			t.Fatalf("slot %d: delay %v after %v", slots, d, last)
		}
		last, slots = d, slots+1
	}
	if slots != 62 {
		t.Errorf("%d slots before the end of time, want 62", slots)
	}
}

func TestPacerTakeSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPacer(t, throttle.PerSecond(10), 0, leakybucket.Unbounded)
		start := time.Now()
		var mu sync.Mutex
		var at []time.Duration
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				if err := p.Take(t.Context()); err != nil {
					t.Error(err)
				}
				mu.Lock()
				at = append(at, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		slices.Sort(at)
		for i, d := range at {
			if d != time.Duration(i)*100*time.Millisecond {
				t.Fatalf("slots %v: want exactly 100ms apart from 0", at)
			}
		}
	})
}

// TestPacerCancel: a caller whose ctx ends before its slot gives the slot
// back, so the next caller gets it.
func TestPacerCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPacer(t, throttle.PerSecond(10), 0, leakybucket.Unbounded)
		start := time.Now()
		if err := p.Take(t.Context()); err != nil { // slot 0
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		go func() { time.Sleep(30 * time.Millisecond); cancel() }()
		if err := p.Take(ctx); !errors.Is(err, context.Canceled) { // slot 100ms, abandoned at 30ms
			t.Fatalf("Take with a cancelled ctx: %v", err)
		}
		if err := p.Take(t.Context()); err != nil || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("next Take: %v at %v, want the given-back slot at 100ms", err, time.Since(start))
		}
		// A deadline before the slot fails at once and gives the slot back.
		ctx, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel2()
		if err := p.Take(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("Take past the deadline: %v at %v", err, time.Since(start))
		}
		if d := reserve(t, p); d != 100*time.Millisecond {
			t.Fatalf("slot after the refused Take: %v, want 100ms", d)
		}
		// With a booking behind it, an abandoned slot is not given back.
		ctx, cancel3 := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Take(ctx) }() // slot 300ms
		synctest.Wait()
		if d := reserve(t, p); d != 300*time.Millisecond { // slot 400ms, behind it
			t.Fatalf("slot behind the sleeper: %v", d)
		}
		cancel3()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		if d := reserve(t, p); d != 400*time.Millisecond { // 300ms stays unused
			t.Fatalf("slot after abandoning: %v, want 400ms", d)
		}
	})
}

func BenchmarkPacerReserve(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		p := newPacer(b, throttle.NewRate(int(bridge.MaxPerSecond), time.Second), 10, leakybucket.Unbounded)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Reserve(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		p := newPacer(b, throttle.NewRate(int(bridge.MaxPerSecond), time.Second), 10, leakybucket.Unbounded)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Reserve(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
