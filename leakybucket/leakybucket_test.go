package leakybucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	for _, s := range []struct {
		name     string
		rate     throttle.Rate
		capacity int
	}{
		{"5/s,cap10", throttle.PerSecond(5), 10},
		{"7/min,cap3", throttle.NewRate(7, time.Minute), 3}, // 8571428571.4 ns per unit
		{"1/6s,cap1", throttle.NewRate(1, 6*time.Second), 1},
	} {
		bound := func(d time.Duration) int64 { return int64(s.capacity) + s.rate.Events(d) }
		limitertest.Conformance(t, s.name, throttletest.Suite{Limit: s.capacity, Bound: bound}, leakybucket.NewBucket, leakybucket.New, s.rate, s.capacity)
		// A Pacer with slack capacity-1 grants at most capacity slots at
		// once: through Allow it is the same bucket.
		t.Run("Pacer/"+s.name, func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
					p, err := leakybucket.NewPacer(s.rate, s.capacity-1, leakybucket.Unbounded, throttle.WithClock(clk))
					if err != nil {
						t.Fatal(err)
					}
					return p
				},
				Limit: s.capacity, Bound: bound, Single: true,
			})
		})
	}
}

func TestConstructorErrors(t *testing.T) {
	for _, c := range []struct {
		name     string
		rate     throttle.Rate
		capacity int
	}{
		{"zero rate", throttle.Rate{}, 1},
		{"zero capacity", throttle.PerSecond(1), 0},
		{"negative capacity", throttle.PerSecond(1), -1},
		{"span too long", throttle.NewRate(1, bridge.MaxPeriod), 100},
	} {
		if _, err := leakybucket.NewBucket(c.rate, c.capacity); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewBucket %s: %v", c.name, err)
		}
		if _, err := leakybucket.New(c.rate, c.capacity); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New %s: %v", c.name, err)
		}
	}
	limitertest.ZeroValues(t, new(leakybucket.Bucket), new(leakybucket.Limiter))
}

// TestMeterTrace: capacity 4, draining 2 per second. Requests of the
// given size at the given times, with the level after each.
func TestMeterTrace(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, leakybucket.NewBucket, throttle.PerSecond(2), 4, throttle.WithClock(clk))
	start := clk.Now()
	for _, s := range []struct {
		at    time.Duration
		n     int
		ok    bool
		level int64
		free  int
	}{
		{0, 3, true, 3, 1},
		{0, 2, false, 3, 1},                       // 3+2 > 4: overflow
		{250 * time.Millisecond, 2, false, 3, 1},  // level 2.5: still no room for 2
		{500 * time.Millisecond, 2, true, 4, 0},   // level 2 + 2 = 4: fits exactly
		{time.Second, 1, true, 4, 0},              // drained 1, poured 1
		{3 * time.Second, 4, true, 4, 0},          // drained to 0
		{3500 * time.Millisecond, 2, false, 3, 1}, // level 3: no room for 2, RetryAfter 500ms
		{4*time.Second - 1, 2, false, 3, 1},       // 1 ns short
		{4 * time.Second, 2, true, 4, 0},          // exactly at RetryAfter
		{10 * time.Second, 1, true, 1, 3},         // idle: empty again
		{10*time.Second + time.Nanosecond, 4, false, 1, 3},
	} {
		clk.Set(start.Add(s.at))
		d, err := b.AllowN(s.n)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != s.ok || b.Level() != s.level || d.Remaining != s.free {
			t.Fatalf("at %v n=%d: %+v level %d; want allowed %v level %d free %d", s.at, s.n, d, b.Level(), s.ok, s.level, s.free)
		}
		if s.at == 3500*time.Millisecond && d.RetryAfter != 500*time.Millisecond {
			t.Fatalf("RetryAfter = %v, want 500ms", d.RetryAfter)
		}
	}
}

func TestDebitLevel(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, leakybucket.NewBucket, throttle.PerSecond(10), 5, throttle.WithClock(clk))
	if err := b.Debit(12); err != nil {
		t.Fatal(err)
	}
	if got := b.Level(); got != 12 {
		t.Fatalf("Level after Debit(12) = %d", got)
	}
	if d, _ := b.AllowN(1); d.Allowed || d.RetryAfter != 800*time.Millisecond || d.ResetAfter != 1200*time.Millisecond {
		t.Fatalf("Allow above capacity: %+v", d)
	}
	clk.Advance(650 * time.Millisecond)
	if got := b.Level(); got != 6 { // 5.5 rounded up
		t.Fatalf("Level = %d, want 6", got)
	}
	if err := b.Debit(0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Debit(0): %v", err)
	}
	if err := b.SetCapacity(10); err != nil || b.Capacity() != 10 || b.Level() != 6 {
		t.Fatalf("SetCapacity(10): %v, capacity %d, level %d", err, b.Capacity(), b.Level())
	}
	if err := b.SetRate(throttle.PerSecond(20)); err != nil || b.Rate() != throttle.PerSecond(20) || b.Level() != 11 {
		t.Fatalf("SetRate(20/s): %v, rate %v, level %d (want 11: 550ms of drain at 20/s)", err, b.Rate(), b.Level())
	}

	l := limitertest.New(t, leakybucket.New, throttle.PerSecond(10), 5, throttle.WithClock(clk))
	if err := l.Debit("a", 7); err != nil {
		t.Fatal(err)
	}
	if l.Level("a") != 7 || l.Level("b") != 0 {
		t.Fatalf("Level(a) %d Level(b) %d", l.Level("a"), l.Level("b"))
	}
	if err := l.SetCapacity(8); err != nil || l.Capacity() != 8 {
		t.Fatal(err)
	}
	if d, _ := l.Allow(t.Context(), "a", 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Allow(a) at level 7 of 8: %+v", d)
	}
	if err := l.SetRate(throttle.PerSecond(5)); err != nil || l.Rate() != throttle.PerSecond(5) {
		t.Fatal(err)
	}
	if _, err := l.Allow(t.Context(), "a", 9); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("Allow above capacity: %v", err)
	}
}
