package gcra

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/throttletest"
)

func TestSingleLayout(t *testing.T) {
	var b Single
	st := unsafe.Offsetof(b.st)
	if end := unsafe.Offsetof(b.clk) + unsafe.Sizeof(b.clk); st-end < cacheLine {
		t.Fatalf("TAT at %d, only %d bytes after the config", st, st-end)
	}
	if after := unsafe.Sizeof(b) - st - 8; after < cacheLine-8 {
		t.Fatalf("only %d bytes of padding after the TAT", after)
	}
}

func mustConfig(t *testing.T, r throttle.Rate, burst int) *Config {
	t.Helper()
	c, err := NewConfig(r, burst)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newKeyed returns a Keyed limiter reading clk, closed when t ends.
func newKeyed(t *testing.T, r throttle.Rate, burst int, clk *throttletest.Clock) *Keyed {
	t.Helper()
	l := new(Keyed)
	if err := l.Init(r, burst, throttle.WithClock(clk)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestStateDeadAndRetire(t *testing.T) {
	c := mustConfig(t, throttle.PerSecond(10), 2)
	var s State
	now := int64(1e18)
	if tat, ok, live := s.Take(now, c.Cost(1), c.Tau); !ok || !live || tat != now+c.Interval {
		t.Fatalf("Take on a fresh state: %d %v %v", tat, ok, live)
	}
	if s.Retire(keyed.At(now), false) {
		t.Fatal("retired a state that is not full")
	}
	if s.Retire(keyed.At(now+c.Interval-1), false) {
		t.Fatal("retired a state 1ns before it is full")
	}
	if !s.Retire(keyed.At(now+c.Interval), false) {
		t.Fatal("did not retire a full state")
	}
	if _, ok, live := s.Take(now, c.Cost(1), c.Tau); ok || live {
		t.Fatal("Take on a dead state")
	}
	if s.Debit(now, 1) || s.Refund(now+c.Interval, c.Interval) {
		t.Fatal("Debit or Refund revived a dead state")
	}
	if _, live := s.Load(); live || !s.Retire(keyed.At(now), false) {
		t.Fatal("dead state reads live")
	}
	var f State
	f.Take(now, c.Cost(2), c.Tau)
	if !f.Retire(keyed.At(now), true) {
		t.Fatal("forced retirement refused")
	}
}

func TestDebitSaturates(t *testing.T) {
	c := mustConfig(t, throttle.PerSecond(1), 1)
	var s State
	now := int64(1e18)
	s.Debit(now, c.Cost(1<<62))
	tat, _ := s.Load()
	if tat != now+maxDebt {
		t.Fatalf("TAT after a huge debit: now+%d, want now+%d", tat-now, maxDebt)
	}
	// A debit with the clock behind never moves TAT back.
	s.Debit(now-int64(time.Hour), c.Cost(5))
	if got, _ := s.Load(); got != tat {
		t.Fatalf("a debit with an earlier clock moved TAT from %d to %d", tat, got)
	}
	if got := c.Tokens(now, tat); got != 1-(maxDebt+c.Interval-1)/c.Interval {
		t.Fatalf("Tokens = %d", got)
	}
}

func TestKeyedRetiredKeyIsFresh(t *testing.T) {
	clk := throttletest.NewClock()
	l := newKeyed(t, throttle.PerSecond(10), 2, clk)
	allow(l, "k", 2)
	clk.Advance(200*time.Millisecond - 1)
	if n := l.Map().Sweep(); n != 0 || l.Map().Len() != 1 {
		t.Fatalf("Sweep dropped %d, Len %d; want the key kept until full", n, l.Map().Len())
	}
	clk.Advance(1)
	if n := l.Map().Sweep(); n != 1 || l.Map().Len() != 0 {
		t.Fatalf("Sweep dropped %d, Len %d", n, l.Map().Len())
	}
	if d, _ := allow(l, "k", 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Allow after the key was dropped: %+v", d)
	}
}

func checkUnits(t *testing.T, d uint64, x int64) {
	t.Helper()
	var c Config
	c.Interval = int64(d)
	c.magic, c.shift = newDivisor(d)
	if got, want := c.units(x), x/int64(d); got != want {
		t.Fatalf("units(%d) with interval %d = %d, want %d", x, d, got, want)
	}
}

func TestUnits(t *testing.T) {
	ds := []uint64{1, 2, 3, 4, 5, 7, 8, 9, 10, 1000, 333333334, 1e9, 1<<32 - 1, 1 << 32, 1<<32 + 1, uint64(bridge.MaxPeriod), 1<<55 - 1}
	xs := []int64{0, 1, 2, 1e9 - 1, 1e9, 1<<32 - 1, 1 << 40, MaxSpan - 1, MaxSpan, 1<<divBits - 1}
	for _, d := range ds {
		for _, x := range xs {
			for _, dx := range []int64{-1, 0, 1} {
				if y := x + dx; y >= 0 && y < 1<<divBits {
					checkUnits(t, d, y)
				}
			}
			// Around the multiples of d, where a wrong quotient shows.
			if q := x / int64(d); q > 0 {
				for _, y := range []int64{q*int64(d) - 1, q * int64(d), q*int64(d) + 1} {
					if y >= 0 && y < 1<<divBits {
						checkUnits(t, d, y)
					}
				}
			}
		}
	}
}

func FuzzUnits(f *testing.F) {
	f.Add(uint64(3), int64(1e9))
	f.Fuzz(func(t *testing.T, d uint64, x int64) {
		d = 1 + d%uint64(bridge.MaxPeriod)
		if x < 0 {
			x = -(x + 1)
		}
		checkUnits(t, d, x%(1<<divBits))
	})
}

// TestStressRetire races decisions and reservations against a goroutine
// sweeping the map (retiring full keys) in a loop. Time moves in steps of
// 4 s at a rate of 1/s and a burst of 3, so that at the start of each step
// every key has been full for the retire margin: while the step lasts
// (time frozen), each key must admit exactly 3, whether its state was
// retired and recreated or not.
func TestStressRetire(t *testing.T) {
	clk := throttletest.NewClock()
	l := newKeyed(t, throttle.PerSecond(1), 3, clk)
	keys := []string{"a", "b", "c", "d"}
	var retired int
	for step := range 200 {
		clk.Advance(4 * time.Second)
		var admitted, cancelled [4]atomic.Int64
		stop := make(chan struct{})
		swept := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					swept <- n
					return
				default:
					n += l.Map().Sweep()
				}
			}
		}()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				runtime.Gosched()
				for i := range 32 {
					k := (w + i) % len(keys)
					if i%8 == 7 {
						res, err := l.Reserve(keys[k], 1, 0)
						if err != nil {
							t.Error(err)
							return
						}
						if res.OK {
							cancelled[k].Add(1)
						}
						res.Cancel()
						continue
					}
					d, err := allow(l, keys[k], 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted[k].Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		retired += <-swept
		for k := range keys {
			// A cancelled booking comes back only if nothing was booked
			// after it, so each one may cost a unit; nothing may add one.
			if got, c := admitted[k].Load(), cancelled[k].Load(); got > 3 || got < 3-c {
				t.Fatalf("step %d: key %s admitted %d with time frozen and %d bookings cancelled, want 3-%d to 3", step, keys[k], got, c, c)
			}
		}
	}
	t.Logf("%d keys retired in 200 steps", retired)
}

// TestStaleDecisionLifted: a decision whose clock reading predates a sweep
// must not find a fresh state where the old one was not yet full at its
// reading: it is lifted to the instant the sweep judged from. Simulated by
// moving the virtual clock back.
func TestStaleDecisionLifted(t *testing.T) {
	clk := throttletest.NewClock()
	l := newKeyed(t, throttle.PerSecond(1), 3, clk)
	allow(l, "k", 3) // full again at +3 s
	clk.Advance(3 * time.Second)
	if n := l.Map().Sweep(); n != 1 {
		t.Fatalf("Sweep dropped %d, want the full key", n)
	}
	clk.Advance(-500 * time.Millisecond)
	if d, _ := allow(l, "k", 3); !d.Allowed || d.ResetAfter != 3*time.Second {
		t.Fatalf("decision read 0.5 s before the sweep: %+v, want admitted as of the sweep", d)
	}
	clk.Advance(500 * time.Millisecond)
	if d, _ := allow(l, "k", 1); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("at the sweep's instant: %+v, want denied for 1s", d)
	}
}

// allow is Keyed.Allow returning the Decision.
func allow(l *Keyed, key string, n int) (d throttle.Decision, err error) {
	err = l.Allow(&d, key, n)
	return d, err
}

// FuzzWhen checks Config.When against Tokens: the bucket holds k units at
// When and, if When is after now, not one nanosecond before.
func FuzzWhen(f *testing.F) {
	f.Add(int64(3), int64(5), int64(1e9), int64(2e9), int64(2))
	f.Add(int64(7), int64(1), int64(0), int64(MaxSpan), int64(-4))
	f.Fuzz(func(t *testing.T, perSecond, burst, now, tat, k int64) {
		perSecond = 1 + max(perSecond, -perSecond)%1e6
		burst = 1 + max(burst, -burst)%1e6
		c, err := NewConfig(throttle.PerSecond(int(perSecond)), int(burst))
		if err != nil {
			t.Skip()
		}
		now %= 1 << 62
		tat = now + tat%maxDebt // as Debit leaves it at most
		k %= 4 * burst
		w := c.When(now, tat, k)
		switch {
		case k > burst:
			if w != End {
				t.Fatalf("When(k=%d > burst %d) = %d, want End", k, burst, w)
			}
		case w < now:
			t.Fatalf("When = %d before now %d", w, now)
		case c.Tokens(w, tat) < k:
			t.Fatalf("Tokens(When) = %d < %d", c.Tokens(w, tat), k)
		case w > now && c.Tokens(w-1, tat) >= k:
			t.Fatalf("Tokens(When-1) = %d >= %d: When is late", c.Tokens(w-1, tat), k)
		}
	})
}

// EmptyAll empties every bucket held, full or not, and leaves one in debt
// as it is; keys not held yet still start full.
func TestKeyedEmptyAll(t *testing.T) {
	clk := throttletest.NewClock()
	l := newKeyed(t, throttle.PerSecond(10), 4, clk)
	allow(l, "some", 1)
	if err := l.Debit("debt", 10); err != nil {
		t.Fatal(err)
	}
	l.EmptyAll()
	for key, want := range map[string]int64{"some": 0, "debt": -6, "new": 4} {
		if got := l.Tokens(key); got != want {
			t.Errorf("%s: %d tokens after EmptyAll, want %d", key, got, want)
		}
	}
	clk.Advance(100 * time.Millisecond)
	if got := l.Tokens("some"); got != 1 {
		t.Errorf("a token's refill time after: %d tokens, want 1", got)
	}
}
