package httplimit_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/retry"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// healthy is an upstream that answers every request with 200 and counts
// them.
func healthy(served *atomic.Int64) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		served.Add(1)
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
	})
}

// documentedStack is the outbound stack of the HTTP guide and
// docs/adaptive.md, as they write it: retries outermost, then the
// Throttler, then the limiter, in front of upstream.
func documentedStack(t *testing.T, limiter throttle.Limiter, upstream http.RoundTripper) (*http.Client, *adaptive.Throttler, *retry.Budget) {
	throttler, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	budget, err := retry.NewBudget(10, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &httplimit.RetryTransport{
		Policy: &retry.Policy{Budget: budget},
		Base: &httplimit.ThrottledTransport{Throttler: throttler,
			Base: &httplimit.Transport{Limiter: limiter, Base: upstream}}}}, throttler, budget
}

// TestDocumentedStackHealthyUpstream: 16 clients × 40 requests, one a
// second each, through the documented stack to a healthy upstream behind
// a limit of 2 a second. The upstream never refuses, so the Throttler must
// never drop: the limiter's refusals are local decisions the upstream did
// not see, and count neither as requests nor as rejections. Served is what
// the limiter allows (its burst, then 2 a second while the clients run,
// retries included); the retry budget is not spent on local refusals;
// afterwards one client alone is never dropped. Before, the refusals
// counted as requests without accepts: 478 requests dropped by the
// Throttler, the budget emptied, and one client alone served 34 of 100.
func TestDocumentedStackHealthyUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := tokenbucket.New(throttle.PerSecond(2), 2)
		if err != nil {
			t.Fatal(err)
		}
		var served atomic.Int64
		client, throttler, budget := documentedStack(t, lim, healthy(&served))
		var drops atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		// Each client starts 1 ms after the one before, so that no two
		// requests are in flight at one instant: 16 refused together can
		// raise the drop probability for the moment between the
		// Throttler's count and the withdrawal, and its own drops can then
		// keep it up (stated in the registry, edge-outbound).
		for i := range 16 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond)
				for range 40 {
					getCounting(t, client, &drops)
					time.Sleep(time.Second)
				}
			})
		}
		wg.Wait()
		allows := 2 + int64(2*time.Since(start).Seconds()) // the burst, then 2 a second
		if n := served.Load(); n < allows-2 || n > allows || drops.Load() != 0 {
			t.Errorf("served %d (the limiter allows %d), the Throttler dropped %d; drop probability %.2f",
				n, allows, drops.Load(), throttler.DropProbability())
		}
		if budget.Tokens() < 10 {
			t.Errorf("the retry budget holds %.1f of 10 tokens: local refusals were charged as failures", budget.Tokens())
		}
		before := served.Load()
		for range 100 {
			getCounting(t, client, &drops)
			time.Sleep(time.Second)
		}
		if n := served.Load() - before; n != 100 || drops.Load() != 0 {
			t.Errorf("one client alone: %d of 100 served, %d dropped by the Throttler", n, drops.Load())
		}
	})
}

// getCounting sends one request; it counts the Throttler's drops (a LimitedError
// without RetryAfter: the token bucket's refusals carry one).
func getCounting(t *testing.T, c *http.Client, drops *atomic.Int64) {
	resp, err := c.Get("http://upstream.test/")
	var le *throttle.LimitedError
	switch {
	case errors.As(err, &le):
		if le.Decision.RetryAfter == 0 {
			drops.Add(1)
		}
	case err != nil:
		t.Error(err)
	default:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// windows records the windows an adaptive.Limiter closes.
type windows struct{ seen []adaptive.Window }

func (w *windows) Update(limit float64, win adaptive.Window) float64 {
	w.seen = append(w.seen, win)
	return limit
}

// TestTransportAdaptiveIgnoresLocalRefusal: a Transport whose Limiter is
// an adaptive.Limiter, in front of a layer that refuses locally (a
// ThrottledTransport dropping, a second Transport), releases those
// requests as Ignored: they are no RTT samples. Before, each was a
// success of 0 s, and the window's MinRTT fell to 0 although the upstream
// answers in 50 ms.
func TestTransportAdaptiveIgnoresLocalRefusal(t *testing.T) {
	clk := throttletest.NewClock()
	rec := &windows{}
	lim, err := adaptive.New(rec, adaptive.Config{}, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	refuse := true
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if refuse {
			return nil, &throttle.LimitedError{Key: "inner"}
		}
		clk.Advance(50 * time.Millisecond)
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	c := &http.Client{Transport: &httplimit.Transport{Limiter: lim, Base: base}}
	for i := range 40 {
		refuse = i%2 == 0
		resp, err := c.Get("http://upstream.test/")
		if err == nil {
			resp.Body.Close()
		} else if !errors.Is(err, throttle.ErrLimited) {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	if len(rec.seen) == 0 {
		t.Fatal("no window closed")
	}
	for _, w := range rec.seen {
		if w.MinRTT != 50*time.Millisecond || w.Dropped != 0 {
			t.Errorf("window %+v: local refusals counted as samples", w)
		}
	}
}

// TestStackedMiddlewareAdaptiveIgnoresInnerRefusal: an adaptive.Limiter as
// the outer middleware of a stack (global(perClient(h)), as the guide
// stacks them) in front of a per-client limit that refuses most requests:
// the 429s the inner one answers never ran the handler, and are no RTT
// samples for the outer one. Before, each was a success of 0 s: the
// window's MinRTT fell to 0 although the handler takes 50 ms.
func TestStackedMiddlewareAdaptiveIgnoresInnerRefusal(t *testing.T) {
	clk := throttletest.NewClock()
	rec := &windows{}
	global, err := adaptive.New(rec, adaptive.Config{}, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	perClient, err := tokenbucket.New(throttle.PerSecond(10), 1, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(t, global, httplimit.WithName("global"))(mw(t, perClient, httplimit.WithName("client"))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { clk.Advance(50 * time.Millisecond) })))
	denied := 0
	for range 60 {
		if w := get(h, "192.0.2.1:1"); w.Code == http.StatusTooManyRequests {
			denied++
		}
		clk.Advance(10 * time.Millisecond)
	}
	if len(rec.seen) == 0 || denied == 0 {
		t.Fatalf("%d windows closed, %d denied", len(rec.seen), denied)
	}
	for _, w := range rec.seen {
		if w.MinRTT != 50*time.Millisecond {
			t.Errorf("window %+v: the inner middleware's refusals counted as samples", w)
		}
	}
}
