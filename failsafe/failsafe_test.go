package failsafe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// store is a fake remote-backed limiter whose failure mode tests set.
type store struct {
	mu    sync.Mutex
	mode  string // "", "down", "slow", "bad"
	calls int
}

func (s *store) set(mode string) { s.mu.Lock(); s.mode = mode; s.mu.Unlock() }

func (s *store) Allow(ctx context.Context, _ string, n int) (throttle.Decision, error) {
	s.mu.Lock()
	mode := s.mode
	s.calls++
	s.mu.Unlock()
	switch mode {
	case "down":
		return throttle.Decision{}, fmt.Errorf("%w: connection refused", throttle.ErrUnavailable)
	case "slow":
		<-ctx.Done()
		return throttle.Decision{}, ctx.Err()
	case "bad":
		return throttle.Decision{}, fmt.Errorf("%w: key holds bad data", throttle.ErrInvalid)
	}
	return throttle.Decision{Allowed: true, Limit: 10, Remaining: 10 - n}, nil
}

func (s *store) Quota() throttle.Quota { return throttle.Quota{Limit: 10, Window: time.Second} }

// kinds records the kinds of events observed.
type kinds struct {
	mu sync.Mutex
	ks []throttle.EventKind
}

func (k *kinds) Observe(e throttle.Event) { k.mu.Lock(); k.ks = append(k.ks, e.Kind); k.mu.Unlock() }

func (k *kinds) count(kind throttle.EventKind) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, x := range k.ks {
		if x == kind {
			n++
		}
	}
	return n
}

func TestClosedPolicyAndBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &store{}
		var obs kinds
		l, err := failsafe.New(s, failsafe.WithTimeout(50*time.Millisecond), failsafe.WithBreaker(3, time.Second, 4*time.Second), failsafe.WithObserver("s", &obs))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("healthy: %+v, %v", d, err)
		}
		s.set("down")
		for i := range 3 {
			if d, err := l.Allow(ctx, "k", 1); d.Allowed || !errors.Is(err, throttle.ErrUnavailable) {
				t.Fatalf("failure %d: %+v, %v; want denied, ErrUnavailable", i, d, err)
			}
		}
		calls := s.calls
		d, err := l.Allow(ctx, "k", 1)
		if !errors.Is(err, failsafe.ErrOpen) || d.RetryAfter != time.Second || s.calls != calls {
			t.Fatalf("open breaker: %+v, %v, store called %d times more", d, err, s.calls-calls)
		}
		s.set("")
		time.Sleep(time.Second)
		if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("probe: %+v, %v", d, err)
		}
		if obs.count(throttle.EventBreakerOpen) != 1 || obs.count(throttle.EventBreakerClosed) != 1 {
			t.Fatalf("events %v: want one opening and one closing", obs.ks)
		}
	})
}

func TestTimeoutCountsAndCancelDoesNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &store{mode: "slow"}
		var obs kinds
		l, err := failsafe.New(s, failsafe.WithTimeout(50*time.Millisecond), failsafe.WithBreaker(2, time.Second, time.Second), failsafe.WithObserver("s", &obs))
		if err != nil {
			t.Fatal(err)
		}
		// A caller that cancels is not the store's failure.
		for range 3 {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(10*time.Millisecond, cancel)
			if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled call: %v", err)
			}
		}
		if obs.count(throttle.EventBreakerOpen) != 0 {
			t.Fatal("cancelled calls opened the breaker")
		}
		// A store slower than the timeout is: the policy applies, and the
		// error wraps both ErrUnavailable and DeadlineExceeded.
		start := time.Now()
		_, err = l.Allow(context.Background(), "k", 1)
		// (Done is shared per tick of timeout/8: at most one tick late.)
		if el := time.Since(start); !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || el < 50*time.Millisecond || el > 50*time.Millisecond+50*time.Millisecond/8 {
			t.Fatalf("slow store: %v after %v", err, time.Since(start))
		}
		// A caller's own deadline, shorter than the timeout, is not
		// (TestCallerDeadlineIsNotAStoreFailure); one longer than it is
		// cut to the timeout, which counts.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err = l.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrUnavailable) || obs.count(throttle.EventBreakerOpen) != 1 {
			t.Fatalf("caller deadline past the timeout: %v, breaker openings %d", err, obs.count(throttle.EventBreakerOpen))
		}
	})
}

func TestRequestErrorsPassThrough(t *testing.T) {
	s := &store{mode: "bad"}
	var obs kinds
	l, err := failsafe.New(s, failsafe.WithPolicy(failsafe.Open), failsafe.WithBreaker(1, time.Hour, time.Hour), failsafe.WithObserver("s", &obs))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if d, err := l.Allow(context.Background(), "k", 1); d.Allowed || !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("bad request: %+v, %v; want its own error, not the policy", d, err)
		}
	}
	if obs.count(throttle.EventBreakerOpen) != 0 {
		t.Fatal("request errors opened the breaker")
	}
}

func TestOpenAndFallbackPolicies(t *testing.T) {
	s := &store{mode: "down"}
	var obs kinds
	open, err := failsafe.New(s, failsafe.WithPolicy(failsafe.Open), failsafe.WithObserver("o", &obs))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := open.Allow(context.Background(), "k", 2); err != nil || !d.Allowed || d.Limit != 10 || d.Remaining != 8 {
		t.Fatalf("Open: %+v, %v", d, err)
	}
	local, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1)
	defer local.Close()
	fb, err := failsafe.New(s, failsafe.WithFallback(local), failsafe.WithObserver("o", &obs))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if d, err := fb.Allow(context.Background(), "k", 1); err != nil || d.Allowed != want {
			t.Fatalf("Fallback call %d: %+v, %v; want the local limiter's decision", i, d, err)
		}
	}
	if n := obs.count(throttle.EventFallback); n != 3 {
		t.Fatalf("%d fallback events, want 3", n)
	}
	if q := fb.(throttle.QuotaReporter).Quota(); q.Limit != 10 {
		t.Fatalf("Quota = %+v, want the store's", q)
	}
}

func TestBadOptions(t *testing.T) {
	s := &store{}
	for name, opts := range map[string][]failsafe.Option{
		"nil option":        {nil},
		"unknown policy":    {failsafe.WithPolicy(9)},
		"fallback nil":      {failsafe.WithFallback(nil)},
		"zero timeout":      {failsafe.WithTimeout(0)},
		"negative failures": {failsafe.WithBreaker(-1, time.Second, time.Second)},
		"keyed option":      {failsafe.WithOptions(throttle.WithMaxKeys(5))},
		"nil clock":         {failsafe.WithOptions(throttle.WithClock(nil))},
	} {
		if _, err := failsafe.New(s, opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := failsafe.New(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("nil limiter: %v", err)
	}
}

// BenchmarkHealthy is the cost the decorator adds to a healthy store's
// call: one breaker load and a shared deadline.
func BenchmarkHealthy(b *testing.B) {
	l, _ := failsafe.New(&store{})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow(ctx, "k", 1)
		}
	})
}

func Example() {
	// A limiter backed by a store that is down: Redis, a daemon, any
	// throttle.Limiter whose failures wrap throttle.ErrUnavailable.
	down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, throttle.ErrUnavailable
	})
	local, _ := tokenbucket.New(throttle.NewRate(1, time.Minute), 1) // per-instance share
	defer local.Close()
	l, _ := failsafe.New(down, failsafe.WithFallback(local))
	for range 2 {
		d, err := l.Allow(context.Background(), "client-7", 1)
		fmt.Println(d.Allowed, err)
	}
	// Output:
	// true <nil>
	// false <nil>
}

// panicky panics on its first call after set(true), then answers.
type panicky struct {
	mu    sync.Mutex
	arm   bool
	calls int
}

func (p *panicky) Allow(context.Context, string, int) (throttle.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.arm {
		p.arm = false
		panic("store client bug")
	}
	return throttle.Decision{Allowed: true}, nil
}

// A probe whose store call panics lets the next caller probe.
func TestPanickingProbeReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &panicky{}
		down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
			return throttle.Decision{}, throttle.ErrUnavailable
		})
		var cur throttle.Limiter = down
		var mu sync.Mutex
		var obs kinds
		l, err := failsafe.New(throttle.LimiterFunc(func(ctx context.Context, k string, n int) (throttle.Decision, error) {
			mu.Lock()
			c := cur
			mu.Unlock()
			return c.Allow(ctx, k, n)
		}), failsafe.WithBreaker(1, 100*time.Millisecond, 100*time.Millisecond), failsafe.WithObserver("s", &obs))
		if err != nil {
			t.Fatal(err)
		}
		l.Allow(context.Background(), "k", 1) // opens
		mu.Lock()
		cur, inner.arm = inner, true
		mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		func() {
			defer func() { _ = recover() }()
			l.Allow(context.Background(), "k", 1) // the probe panics
		}()
		if d, err := l.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
			t.Fatalf("after the panicking probe: %+v, %v (store called %d times)", d, err, inner.calls)
		}
		if obs.count(throttle.EventBreakerOpen) != obs.count(throttle.EventBreakerClosed) {
			t.Fatalf("breaker still open: events %v", obs.ks)
		}
	})
}

// Callers whose own deadline is shorter than the store's answer do not
// open the breaker for everyone else.
func TestCallerDeadlineIsNotAStoreFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := throttle.LimiterFunc(func(ctx context.Context, _ string, n int) (throttle.Decision, error) {
			select {
			case <-time.After(20 * time.Millisecond):
				return throttle.Decision{Allowed: true}, nil
			case <-ctx.Done():
				return throttle.Decision{}, ctx.Err()
			}
		})
		l, err := failsafe.New(slow, failsafe.WithTimeout(100*time.Millisecond), failsafe.WithBreaker(3, time.Second, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("caller with a 5ms deadline: %v", err)
			}
			cancel()
		}
		if d, err := l.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
			t.Fatalf("another caller: %+v, %v", d, err)
		}
	})
}

// The breaker's cooldown runs on the clock of throttle.WithClock.
func TestClockOption(t *testing.T) {
	s := &store{mode: "down"}
	clk := throttletest.NewClock()
	l, err := failsafe.New(s, failsafe.WithBreaker(1, time.Minute, time.Minute), failsafe.WithOptions(throttle.WithClock(clk)))
	if err != nil {
		t.Fatal(err)
	}
	l.Allow(context.Background(), "k", 1) // opens the breaker
	s.set("")
	if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, failsafe.ErrOpen) {
		t.Fatalf("within the cooldown: %v, want ErrOpen", err)
	}
	clk.Advance(time.Minute)
	if d, err := l.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Fatalf("after the cooldown on the injected clock: %+v, %v", d, err)
	}
}

// TestHangingStoreShortCallers: a store that hangs, and 20 callers whose
// deadlines (20 ms) are all shorter than the per-call timeout (100 ms):
// once no call has been answered for a whole timeout, their expiries count
// as failures, the breaker opens, and the later callers get the policy's
// answer at once. Before: 20 calls, 0 openings, each caller waiting out
// its deadline.
func TestHangingStoreShortCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := throttle.LimiterFunc(func(ctx context.Context, _ string, n int) (throttle.Decision, error) {
			<-ctx.Done()
			return throttle.Decision{}, ctx.Err()
		})
		var obs kinds
		l, err := failsafe.New(hang, failsafe.WithTimeout(100*time.Millisecond), failsafe.WithBreaker(3, time.Second, time.Second),
			failsafe.WithObserver("s", &obs))
		if err != nil {
			t.Fatal(err)
		}
		fast := 0
		for range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			start := time.Now()
			_, err := l.Allow(ctx, "k", 1)
			if time.Since(start) == 0 && errors.Is(err, failsafe.ErrOpen) {
				fast++
			}
			cancel()
		}
		if obs.count(throttle.EventBreakerOpen) != 1 || fast < 10 {
			t.Fatalf("breaker openings %d, calls refused at once %d of 20", obs.count(throttle.EventBreakerOpen), fast)
		}
	})
}
