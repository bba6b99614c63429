package throttle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// spacer admits one unit every interval (burst 1) on the real clock, which
// synctest makes virtual. It reserves unless told not to.
type spacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
	reserves int
}

func (s *spacer) Allow(_ context.Context, _ string, n int) (throttle.Decision, error) {
	if err := limiterkit.CheckN(n, 1); err != nil {
		return throttle.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Before(s.next) {
		return throttle.Decision{Limit: 1, RetryAfter: s.next.Sub(now)}, nil
	}
	s.next = now.Add(s.interval)
	return throttle.Decision{Allowed: true, Limit: 1}, nil
}

type reservingSpacer struct{ spacer }

func (s *reservingSpacer) Reserve(_ context.Context, _ string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	if err := limiterkit.CheckN(n, 1); err != nil {
		return throttle.Reservation{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserves++
	now := time.Now()
	at := s.next
	if at.Before(now) {
		at = now
	}
	if d := at.Sub(now); d > maxWait {
		return throttle.Reservation{Delay: d - maxWait}, nil
	}
	s.next = at.Add(s.interval)
	return limiterkit.NewReservation(at.Sub(now), 1, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.next.Equal(at.Add(s.interval)) {
			s.next = at
		}
	}), nil
}

func TestWaitReservesInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &reservingSpacer{spacer{interval: 100 * time.Millisecond}}
		start := time.Now()
		done := make([]time.Duration, 5)
		var wg sync.WaitGroup
		for i := range done {
			wg.Go(func() {
				if err := throttle.Wait(t.Context(), l, "k", 1); err != nil {
					t.Error(err)
				}
				done[i] = time.Since(start)
			})
			synctest.Wait() // goroutine i books before i+1
		}
		wg.Wait()
		for i, d := range done {
			if want := time.Duration(i) * 100 * time.Millisecond; d != want {
				t.Errorf("waiter %d done at %v, want exactly %v (FIFO, one wake-up per slot)", i, d, want)
			}
		}
		if l.reserves != 5 {
			t.Errorf("%d reservations for 5 waiters, want 5 (no retries)", l.reserves)
		}
	})
}

func TestWaitPessimisticBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &spacer{interval: 100 * time.Millisecond}
		start := time.Now()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if err := throttle.Wait(t.Context(), l, "k", 1, throttle.WithJitter(0.5)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if el := time.Since(start); el < 300*time.Millisecond || el > 2*time.Second {
			t.Errorf("4 waiters at 10/s took %v, want between 300ms and a few jittered back-offs", el)
		}
	})
}

// TestWaitMaxWaitZero: MaxWait(0) books nothing ahead, even on a Reserver:
// Wait asks Allow and backs off.
func TestWaitMaxWaitZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &reservingSpacer{spacer{interval: 100 * time.Millisecond}}
		start := time.Now()
		for range 6 {
			if err := throttle.Wait(t.Context(), l, "k", 1, throttle.MaxWait(0)); err != nil {
				t.Fatal(err)
			}
		}
		if el := time.Since(start); el < 500*time.Millisecond {
			t.Errorf("6 waits at 10/s took %v", el)
		}
		if l.reserves != 0 {
			t.Errorf("MaxWait(0) reserved %d times, want 0", l.reserves)
		}
	})
}

func TestWaitContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &reservingSpacer{spacer{interval: time.Second}}
		if err := throttle.Wait(t.Context(), l, "k", 1); err != nil {
			t.Fatal(err)
		}
		// The next slot is 1 s away: a 500 ms deadline fails at once.
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := throttle.Wait(ctx, l, "k", 1)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 0 {
			t.Fatalf("Wait beyond deadline = %v after %v, want DeadlineExceeded at once", err, time.Since(start))
		}
		// Cancelled while sleeping on a booked slot: the slot is given back.
		ctx, cancel = context.WithCancel(t.Context())
		go func() { time.Sleep(100 * time.Millisecond); cancel() }()
		if err := throttle.Wait(ctx, l, "k", 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait = %v", err)
		}
		res, _ := l.Reserve(t.Context(), "k", 1, time.Hour)
		if res.Delay != 900*time.Millisecond {
			t.Fatalf("after a cancelled wait the next slot is %v away, want the refunded 900ms", res.Delay)
		}
	})
}

func TestWaitErrors(t *testing.T) {
	l := &reservingSpacer{spacer{interval: time.Second}}
	if err := throttle.Wait(context.Background(), l, "k", 2); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("Wait(n > limit) = %v, want ErrExceedsLimit", err)
	}
	if err := throttle.Wait(context.Background(), l, "k", 1, throttle.WithJitter(2)); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("Wait(Jitter(2)) = %v, want ErrInvalid", err)
	}
	for _, o := range []throttle.WaitOption{throttle.KeyFrom(nil), throttle.Blocking()} {
		if err := throttle.Wait(context.Background(), l, "k", 1, o); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("Wait(an option of Wrap) = %v, want ErrInvalid", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := throttle.Wait(ctx, l, "k", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(cancelled ctx) = %v", err)
	}
}

func TestWrap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &spacer{interval: time.Second}
		calls := 0
		f := func(context.Context) (int, error) { calls++; return calls, nil }
		reject := throttle.Wrap(l, "api", f)
		if v, err := reject(t.Context()); v != 1 || err != nil {
			t.Fatalf("first call = %d, %v", v, err)
		}
		v, err := reject(t.Context())
		var le *throttle.LimitedError
		if v != 0 || !errors.Is(err, throttle.ErrLimited) || !errors.As(err, &le) || le.Decision.RetryAfter != time.Second {
			t.Fatalf("throttled call = %d, %v; want ErrLimited with RetryAfter 1s", v, err)
		}
		blocking := throttle.Wrap(l, "api", f, throttle.Blocking(), throttle.WithJitter(0))
		start := time.Now()
		if v, err := blocking(t.Context()); v != 2 || err != nil || time.Since(start) != time.Second {
			t.Fatalf("blocking call = %d, %v after %v; want 2 after 1s", v, err, time.Since(start))
		}
		var asked string
		denyAll := throttle.LimiterFunc(func(_ context.Context, key string, _ int) (throttle.Decision, error) {
			asked = key
			return throttle.Decision{RetryAfter: time.Second}, nil
		})
		keyed := throttle.Wrap(denyAll, "", f, throttle.KeyFrom(func(context.Context) string { return "x" }))
		if _, err := keyed(t.Context()); !errors.Is(err, throttle.ErrLimited) || asked != "x" {
			t.Fatalf("KeyFrom: %v for key %q, want ErrLimited for \"x\"", err, asked)
		}
		if calls != 2 {
			t.Fatalf("f ran %d times, want 2", calls)
		}
	})
}

// held admits nothing until released, with no RetryAfter: capacity comes
// back by release, as on a concurrency limiter.
type held struct{ free atomic.Bool }

func (h *held) Allow(context.Context, string, int) (throttle.Decision, error) {
	if h.free.Load() {
		return throttle.Decision{Allowed: true, Limit: 1}, nil
	}
	return throttle.Decision{Limit: 1}, nil
}

// TestWaitBackoffMeetsDeadline: a unit released at 600 ms is taken by a
// Wait whose deadline is 900 ms; the doubling back-off must not give up
// early because its next step would pass the deadline.
func TestWaitBackoffMeetsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := new(held)
		time.AfterFunc(600*time.Millisecond, func() { h.free.Store(true) })
		ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := throttle.Wait(ctx, h, "k", 1, throttle.WithJitter(0)); err != nil {
			t.Fatalf("Wait after %v: %v", time.Since(start), err)
		}
		if took := time.Since(start); took < 600*time.Millisecond || took > 900*time.Millisecond {
			t.Fatalf("Wait took %v", took)
		}
	})
}

// BenchmarkWait is Wait when the units are free at once, through a
// reservation (tokenbucket is a Reserver) and, with MaxWait(0), through Allow.
func BenchmarkWait(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []throttle.WaitOption
	}{{"reserve", nil}, {"allow", []throttle.WaitOption{throttle.MaxWait(0)}}} {
		b.Run(c.name, func(b *testing.B) {
			l, err := tokenbucket.New(throttle.PerSecond(1_000_000_000), 1_000_000_000)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := throttle.Wait(ctx, l, "k", 1, c.opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
