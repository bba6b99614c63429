package adaptive

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

func mustThrottler(t testing.TB, c ThrottlerConfig, clk throttle.Clock) *Throttler {
	t.Helper()
	th, err := NewThrottler(c, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	return th
}

func TestThrottlerConfigInvalid(t *testing.T) {
	for _, c := range []ThrottlerConfig{{K: 0.5}, {K: -1}, {Window: time.Nanosecond}, {Window: -time.Second}} {
		if _, err := NewThrottler(c); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewThrottler(%+v) = %v, want ErrInvalid", c, err)
		}
	}
}

// TestThrottlerProbability checks the drop probability against the
// formula, its window sliding out, and that drops count as requests.
func TestThrottlerProbability(t *testing.T) {
	clk := throttletest.NewClock()
	th := mustThrottler(t, ThrottlerConfig{K: 2, Window: 16 * time.Second, Rand: func() float64 { return 0.5 }}, clk)
	for range 30 {
		if d, _ := th.Allow(bg, "", 1); !d.Allowed {
			t.Fatal("dropped with every request accepted")
		}
		th.Accept(1)
	}
	if p := th.DropProbability(); p != 0 {
		t.Fatalf("p = %v with every request accepted", p)
	}
	for range 70 { // rejected: no Accept
		th.Allow(bg, "", 1)
	}
	// 100 requests, 30 accepts: (100 − 60) / 101.
	if p, want := th.DropProbability(), 40.0/101; p != want {
		t.Fatalf("p = %v, want %v", p, want)
	}
	clk.Advance(time.Second)
	for range 100 {
		th.Allow(bg, "", 1)
	}
	// 200 requests, 30 accepts: p = 140/201 > 0.5, so Rand's 0.5 drops.
	if d, _ := th.Allow(bg, "", 1); d.Allowed {
		t.Fatalf("allowed at p = %v", th.DropProbability())
	}
	clk.Advance(16 * time.Second) // all of it slides out
	if p := th.DropProbability(); p != 0 {
		t.Fatalf("p = %v after the window passed", p)
	}
	if _, err := th.Allow(bg, "", 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Allow(0) = %v", err)
	}
}

func TestThrottled(t *testing.T) {
	clk := throttletest.NewClock()
	th := mustThrottler(t, ThrottlerConfig{Rand: func() float64 { return 0 }}, clk)
	fail := Throttled(th, "api", func(context.Context) (int, error) { return 0, throttle.ErrUnavailable })
	ok := Throttled(th, "api", func(context.Context) (int, error) { return 1, nil })
	if v, err := ok(bg); v != 1 || err != nil {
		t.Fatalf("ok() = %v, %v", v, err)
	}
	fail(bg) // 2 requests, 1 accept: p = 0
	fail(bg) // 3 requests, 1 accept: p = 1/4 > Rand's 0
	_, err := ok(bg)
	var le *throttle.LimitedError
	if !errors.As(err, &le) || le.Key != "api" || !errors.Is(err, throttle.ErrLimited) {
		t.Fatalf("dropped call = %v, want a *LimitedError for api", err)
	}
}

// TestThrottledLocalRefusal: a call a local limiter refused (f is
// throttle.Wrap of a full limiter, or fails with ErrNotSent) never reached
// the backend and counts neither as a request nor as a rejection. Before,
// each counted as a request without an accept: after 100 of them, p was
// 0.99.
func TestThrottledLocalRefusal(t *testing.T) {
	th := mustThrottler(t, ThrottlerConfig{}, throttletest.NewClock())
	full := func(context.Context) (int, error) { return 0, &throttle.LimitedError{Key: "api"} }
	waited := func(context.Context) (int, error) {
		return 0, fmt.Errorf("waiting: %w: %w", ErrNotSent, context.DeadlineExceeded)
	}
	for range 50 {
		Throttled(th, "api", full)(bg)
		Throttled(th, "api", waited)(bg)
	}
	if p := th.DropProbability(); p != 0 {
		t.Fatalf("p = %v after 100 local refusals, want 0", p)
	}
	th.Allow(bg, "", 3)
	th.Withdraw(5) // more than counted: the rest is ignored
	if p := th.DropProbability(); p != 0 {
		t.Fatalf("p = %v", p)
	}
}

func TestThrottlerAllocs(t *testing.T) {
	if raceOn {
		t.Skip("allocations differ under the race detector")
	}
	th := mustThrottler(t, ThrottlerConfig{}, throttletest.NewClock())
	if n := testing.AllocsPerRun(1000, func() {
		th.Allow(bg, "", 1)
		th.Accept(1)
	}); n != 0 {
		t.Errorf("%v allocs per Allow+Accept", n)
	}
}

// TestThrottlerSRE: 50 clients, each with its own Throttler, offer five
// times what a backend accepts (a token bucket of 100 a second, burst 10);
// without throttling it would reject 80%. The SRE formula predicts that
// the clients send K·accepts, so that (K−1)·accepts are rejected: the
// rejections reaching the backend stay within 1.1 times that.
func TestThrottlerSRE(t *testing.T) {
	const (
		clients  = 50
		capacity = 100.0 // accepts per second
		offered  = 5 * capacity
		k        = 2.0
		step     = 10 * time.Millisecond
		burst    = capacity / 10
		warmup   = 3 * time.Minute
		run      = 8 * time.Minute
	)
	clk := throttletest.NewClock()
	rng := rand.New(rand.NewPCG(1, 2))
	ths := make([]*Throttler, clients)
	for i := range ths {
		ths[i] = mustThrottler(t, ThrottlerConfig{K: k, Rand: rng.Float64}, clk)
	}
	tokens := 0.0
	var accepted, rejected float64
	perStep := offered * step.Seconds() // arrivals per step, each from a client drawn at random
	for el := time.Duration(0); el < run; el += step {
		clk.Advance(step)
		tokens = min(tokens+capacity*step.Seconds(), burst)
		for range poisson(rng, perStep) {
			i := rng.IntN(clients)
			if d, _ := ths[i].Allow(bg, "", 1); !d.Allowed {
				continue
			}
			ok := tokens >= 1
			if ok {
				tokens--
				ths[i].Accept(1)
			}
			if el < warmup {
				continue
			}
			if ok {
				accepted++
			} else {
				rejected++
			}
		}
	}
	predicted := (k - 1) * accepted
	t.Logf("accepted %.0f/s, rejected at the backend %.0f/s, K=2 predicts %.0f/s: %.3fx", accepted/(run-warmup).Seconds(),
		rejected/(run-warmup).Seconds(), predicted/(run-warmup).Seconds(), rejected/predicted)
	if accepted < 0.95*capacity*(run-warmup).Seconds() {
		t.Errorf("the backend accepted %.0f, below 95%% of its capacity", accepted)
	}
	if rejected > 1.1*predicted {
		t.Errorf("rejected %.0f reached the backend, above 1.1 × %.0f", rejected, predicted)
	}
}

// poisson draws from a Poisson distribution of mean m (Knuth's method;
// m is small).
func poisson(r *rand.Rand, m float64) int {
	n := 0
	for p := r.Float64(); p > math.Exp(-m); p *= r.Float64() {
		n++
	}
	return n
}

// TestThrottlerConcurrentCounts: racing Allow and Accept lose no count.
func TestThrottlerConcurrentCounts(t *testing.T) {
	clk := throttletest.NewClock()
	th := mustThrottler(t, ThrottlerConfig{}, clk)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				th.Allow(bg, "", 1)
				th.Accept(1)
			}
		})
	}
	wg.Wait()
	if r, a := th.counts(clk.Now().UnixNano()); r != 8000 || a != 8000 {
		t.Fatalf("counted %v requests, %v accepts; want 8000 each", r, a)
	}
}
