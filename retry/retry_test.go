package retry_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/retry"
)

var bg = context.Background()

func mustBudget(t testing.TB, max int, ratio float64) *retry.Budget {
	t.Helper()
	b, err := retry.NewBudget(max, ratio)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBackoffFullJitter(t *testing.T) {
	top := &retry.Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, Rand: func() float64 { return 0.999999 }}
	for i, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 80: time.Second} {
		if got := top.Backoff(i); got > want || got < want*99/100 {
			t.Errorf("Backoff(%d) at the top of the draw = %v, want just under %v", i, got, want)
		}
	}
	bottom := &retry.Policy{Rand: func() float64 { return 0 }}
	if got := bottom.Backoff(3); got != 0 {
		t.Errorf("Backoff at the bottom of the draw = %v, want 0 (full jitter)", got)
	}
}

func TestBudget(t *testing.T) {
	for _, bad := range [][2]float64{{0, 0.1}, {10, 0}, {10, 0.0005}, {10, 1.5}, {2e6, 0.1}} {
		if _, err := retry.NewBudget(int(bad[0]), bad[1]); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewBudget(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	p := &retry.Policy{MaxAttempts: 100, Budget: mustBudget(t, 10, 0.1), Rand: func() float64 { return 0 }}
	// Full at 10: failures take it to 9, 8, 7, 6 (granted), then 5 (refused).
	for i := range 5 {
		if _, ok := p.Next(1, 0); ok != (i < 4) {
			t.Fatalf("failure %d: retry granted %v", i+1, ok)
		}
	}
	for range 11 { // 5 + 1.1
		p.Succeeded()
	}
	if tok := p.Budget.Tokens(); tok != 6.1 {
		t.Fatalf("Tokens = %v, want 6.1", tok)
	}
	if _, ok := p.Next(1, 0); !ok {
		t.Fatal("refused above half")
	}
}

func TestDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var events []throttle.Event
		p := &retry.Policy{MaxAttempts: 3, MaxRetryAfter: 5 * time.Second, Name: "api",
			Observer: throttle.ObserverFunc(func(e throttle.Event) { events = append(events, e) })}
		calls := 0
		limited := &throttle.LimitedError{Key: "k", Decision: throttle.Decision{RetryAfter: 2 * time.Second}}
		start := time.Now()
		_, err := retry.Do(bg, p, func(context.Context) (int, error) { calls++; return 0, limited })
		if !errors.Is(err, throttle.ErrLimited) || calls != 3 {
			t.Fatalf("Do = %v after %d calls, want ErrLimited after 3", err, calls)
		}
		if el := time.Since(start); el < 4*time.Second {
			t.Fatalf("Do took %v: Retry-After of 2s not waited twice", el)
		}
		if len(events) != 3 || events[0].Kind != throttle.EventRetry || !events[0].Decision.Allowed || events[2].Decision.Allowed || events[2].N != 3 {
			t.Fatalf("events %+v", events)
		}

		// Not retryable, and a wait above MaxRetryAfter: one call each.
		for _, e := range []error{errors.New("bad request"), &throttle.LimitedError{Decision: throttle.Decision{RetryAfter: time.Minute}}} {
			calls = 0
			retry.Do(bg, p, func(context.Context) (int, error) { calls++; return 0, e })
			if calls != 1 {
				t.Fatalf("%v: %d calls", e, calls)
			}
		}

		// Success on the second attempt.
		calls = 0
		v, err := retry.Do(bg, p, func(context.Context) (int, error) {
			if calls++; calls == 1 {
				return 0, throttle.ErrUnavailable
			}
			return 7, nil
		})
		if v != 7 || err != nil || calls != 2 {
			t.Fatalf("Do = %v, %v after %d calls", v, err, calls)
		}

		// A back-off past the deadline is not started: the failure is
		// returned at once (before, Do waited and failed with
		// DeadlineExceeded).
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		start = time.Now()
		_, err = retry.Do(ctx, p, func(context.Context) (int, error) { return 0, limited })
		if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, throttle.ErrLimited) || time.Since(start) != 0 {
			t.Fatalf("Do with a deadline before the back-off's end = %v after %v", err, time.Since(start))
		}

		// The context is cancelled during the back-off.
		ctx, cancel = context.WithCancel(bg)
		time.AfterFunc(time.Second, cancel)
		_, err = retry.Do(ctx, p, func(context.Context) (int, error) { return 0, limited })
		if !errors.Is(err, context.Canceled) || !errors.Is(err, throttle.ErrLimited) {
			t.Fatalf("Do cancelled = %v", err)
		}
	})
}

// TestBudgetBoundsOutageLoad: 1000 requests a second for a minute to a
// backend that fails a share of them. With 3 attempts and no budget,
// retries multiply the load (1.75x at half failing); under a budget of
// max 10 tokens earning 0.1 per success, the load stays within 1.1x of
// the load without retries, whatever the share failing.
func TestBudgetBoundsOutageLoad(t *testing.T) {
	for _, failing := range []float64{0.1, 0.5, 0.9, 1} {
		rng := rand.New(rand.NewPCG(3, 4))
		fail := func() bool { return rng.Float64() < failing }
		load := func(p *retry.Policy) int {
			attempts := 0
			for range 60_000 {
				for attempt := 1; ; attempt++ {
					attempts++
					if !fail() {
						p.Succeeded()
						break
					}
					if _, ok := p.Next(attempt, 0); !ok {
						break
					}
				}
			}
			return attempts
		}
		free := load(&retry.Policy{MaxAttempts: 3, Rand: rng.Float64})
		budgeted := load(&retry.Policy{MaxAttempts: 3, Rand: rng.Float64, Budget: mustBudget(t, 10, 0.1)})
		ratio := float64(budgeted) / 60_000
		t.Logf("%.0f%% failing: load %.3fx without a budget, %.3fx with a 10%% budget", failing*100, float64(free)/60_000, ratio)
		if ratio > 1.1 {
			t.Errorf("%.0f%% failing: a 10%% budget let the load grow %.3fx", failing*100, ratio)
		}
	}
}

// TestNilPolicy: a nil *Policy is the defaults.
func TestNilPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		retry.Do(bg, nil, func(context.Context) (int, error) { calls++; return 0, throttle.ErrUnavailable })
		if calls != 3 {
			t.Fatalf("%d calls, want %d", calls, 3)
		}
	})
}

// TestLocalRefusalNotCharged: a failure that never reached the backend
// (a local limiter's *throttle.LimitedError, as throttle.Wrap returns) is
// retried under the policy but not charged to the Budget, which counts
// the backend's failures. Before, 10 such calls emptied a budget of 10.
func TestLocalRefusalNotCharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustBudget(t, 10, 0.1)
		p := &retry.Policy{MaxAttempts: 3, Budget: b}
		calls := 0
		for range 10 {
			retry.Do(bg, p, func(context.Context) (int, error) {
				calls++
				return 0, &throttle.LimitedError{Key: "k", Decision: throttle.Decision{RetryAfter: time.Second}}
			})
		}
		if b.Tokens() != 10 || calls != 30 {
			t.Fatalf("budget %.1f of 10 after %d calls, want 10 after 30", b.Tokens(), calls)
		}
	})
}
