package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Over a rules.Limiter each key's fields state its own quota (with w),
// and an allow-listed key gets none rather than "exhausted".
func TestFieldsOverRules(t *testing.T) {
	c, err := rules.Parse([]byte(`{
		"default": {"rate": "1/s", "burst": 5},
		"rules": [{"key": "hourly", "limit": 100, "window": "1h"}],
		"allow": {"keys": ["health"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	l, err := rules.New(c, rules.WithLimiterOptions(throttle.WithClock(throttletest.NewClock())))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := mw(t, l, httplimit.WithKey(httplimit.Header("X-Key")), httplimit.WithLegacyHeaders())(ok)
	for _, c := range []struct{ key, policy, limit string }{
		{"hourly", `"default";q=100;w=3600`, `"default";r=99;t=7200`}, // a sliding window's unit leaves over the next window
		{"someone", `"default";q=5;w=5`, `"default";r=4;t=1`},
		{"health", "", ""},
	} {
		w := get(h, "192.0.2.1:1", "X-Key", c.key)
		if w.Code != 200 {
			t.Fatalf("%s: %d", c.key, w.Code)
		}
		if p, r := w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"); p != c.policy || r != c.limit {
			t.Errorf("%s: RateLimit-Policy %q, RateLimit %q; want %q, %q", c.key, p, r, c.policy, c.limit)
		}
		if c.policy == "" && w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("%s: legacy fields %v", c.key, w.Header())
		}
	}
}

// t on an admitted request is when more is available: the next token of a
// bucket, not when it is full again.
func TestFieldsTIsUntilMore(t *testing.T) {
	clk := throttletest.NewClock()
	l, _ := tokenbucket.New(throttle.PerSecond(1), 60, throttle.WithClock(clk))
	defer l.Close()
	h := mw(t, l)(ok)
	var last string
	for range 60 {
		last = get(h, "192.0.2.1:1").Header().Get("RateLimit")
	}
	if last != `"default";r=0;t=1` {
		t.Fatalf("last unit of a 1/s bucket: RateLimit %q, want r=0;t=1", last)
	}
	clk.Advance(500 * time.Millisecond)
	w := get(h, "192.0.2.1:1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("RateLimit") != `"default";r=0;t=1` {
		t.Fatalf("denied: %d %q", w.Code, w.Header().Get("RateLimit"))
	}
	if got := get(h, "192.0.2.2:1").Header().Get("RateLimit"); got != `"default";r=59;t=1` {
		t.Fatalf("first unit: %q", got)
	}
}

// Stacked middlewares: the legacy trio states the policy with the fewest
// units left, not whichever ran last.
func TestLegacyFieldsStacked(t *testing.T) {
	for _, strictOutside := range []bool{true, false} {
		strict, _ := fixedwindow.New(2, time.Hour, frozen())
		loose, _ := fixedwindow.New(1000, time.Hour, frozen())
		outer, inner := mw(t, strict, httplimit.WithName("s"), httplimit.WithLegacyHeaders()), mw(t, loose, httplimit.WithName("l"), httplimit.WithLegacyHeaders())
		if !strictOutside {
			outer, inner = inner, outer
		}
		w := get(outer(inner(ok)), "192.0.2.9:1")
		if l, r := w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"); l != "2" || r != "1" {
			t.Errorf("strict outside %v: X-RateLimit-Limit %q, Remaining %q; want 2, 1", strictOutside, l, r)
		}
		strict.Close()
		loose.Close()
	}
}

// A 503 from an open breaker says when the store will be tried again.
func TestOpenBreakerRetryAfter(t *testing.T) {
	down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, throttle.ErrUnavailable
	})
	l, err := failsafe.New(down, failsafe.WithBreaker(1, 30*time.Second, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(t, l)(ok)
	get(h, "192.0.2.1:1") // opens the breaker
	w := get(h, "192.0.2.1:1")
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "30" {
		t.Fatalf("%d, Retry-After %q; want 503, 30", w.Code, w.Header().Get("Retry-After"))
	}
}

// events counts the decisions an observer saw.
type events struct {
	mu              sync.Mutex
	allowed, denied int
	errs            []error
}

func (e *events) Observe(ev throttle.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ev.Kind == throttle.EventError {
		e.errs = append(e.errs, ev.Err)
	}
	if ev.Kind != throttle.EventDecision {
		return
	}
	if ev.Decision.Allowed {
		e.allowed++
	} else {
		e.denied++
	}
}

// Shadow mode refuses nothing (denials, bad keys, a failed backend) but
// reports each would-be denial; skipped requests are not decided.
func TestShadowAndSkip(t *testing.T) {
	l, _ := fixedwindow.New(2, time.Hour, frozen())
	defer l.Close()
	var ev events
	h := mw(t, l, httplimit.WithShadow(), httplimit.WithObserver("default", &ev), httplimit.WithKey(httplimit.Header("X-Key")),
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/skip" }))(ok)
	for i := range 5 {
		w := get(h, "192.0.2.1:1", "X-Key", "a")
		if w.Code != 200 || w.Header().Get("Retry-After") != "" {
			t.Fatalf("request %d: %d, Retry-After %q", i, w.Code, w.Header().Get("Retry-After"))
		}
	}
	if w := get(h, "192.0.2.1:1"); w.Code != 200 { // no key
		t.Fatalf("no key: %d", w.Code)
	}
	// The request the key function refused (a 400 outside shadow mode) is
	// reported, as an EventError. Before, nothing was.
	if len(ev.errs) != 1 || !errors.Is(ev.errs[0], throttle.ErrInvalid) {
		t.Fatalf("key refusal in shadow mode: errors observed %v, want one wrapping ErrInvalid", ev.errs)
	}
	if ev.allowed != 2 || ev.denied != 3 {
		t.Fatalf("observed %d allowed, %d denied; want 2, 3", ev.allowed, ev.denied)
	}
	r := httptest.NewRequest("GET", "/skip", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get("RateLimit") != "" || ev.allowed+ev.denied != 5 {
		t.Fatalf("skipped: %d %v, %d decisions", w.Code, w.Header(), ev.allowed+ev.denied)
	}
	down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{RetryAfter: time.Second}, throttle.ErrUnavailable
	})
	if w := get(mw(t, down, httplimit.WithShadow())(ok), "192.0.2.1:1"); w.Code != 200 || w.Header().Get("Retry-After") != "" {
		t.Fatalf("backend down in shadow mode: %d %v", w.Code, w.Header())
	}
}

// A limit stated in the request's context decides it, through the
// limiter's AllowQuota, and the fields state that limit.
func TestLimitFromContext(t *testing.T) {
	clk := throttletest.NewClock()
	l, _ := tokenbucket.New(throttle.PerSecond(100), 100, throttle.WithClock(clk))
	defer l.Close()
	var ev events
	limit := mw(t, l, httplimit.WithLimitFromContext(), httplimit.WithObserver("default", &ev), httplimit.WithKey(httplimit.Header("X-Key")))
	plans := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Key") == "free" {
				r = r.WithContext(httplimit.WithRequestLimit(r.Context(), throttle.NewRate(2, time.Minute), 2))
			}
			next.ServeHTTP(w, r)
		})
	}
	h := plans(limit(ok))
	codes := []int{}
	for range 3 {
		w := get(h, "192.0.2.1:1", "X-Key", "free")
		codes = append(codes, w.Code)
		if w.Header().Get("RateLimit-Policy") != `"default";q=2;w=60` {
			t.Fatalf("policy %q", w.Header().Get("RateLimit-Policy"))
		}
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != http.StatusTooManyRequests {
		t.Fatalf("free plan: %v", codes)
	}
	if w := get(h, "192.0.2.1:1", "X-Key", "paid"); w.Code != 200 || w.Header().Get("RateLimit-Policy") != `"default";q=100;w=1` {
		t.Fatalf("own limit: %d %q", w.Code, w.Header().Get("RateLimit-Policy"))
	}
	if ev.allowed != 3 || ev.denied != 1 {
		t.Fatalf("observed %d allowed, %d denied", ev.allowed, ev.denied)
	}
	fw, _ := fixedwindow.New(1, time.Minute)
	defer fw.Close()
	if _, err := httplimit.New(fw, httplimit.WithLimitFromContext()); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("a limiter without AllowQuota: %v", err)
	}
}

// TestConcurrencyDenialStatesNoTime: a full concurrency limit cannot say
// when a slot frees, so its 429 carries no Retry-After and its RateLimit
// item no t (r=0 alone). Before: Retry-After: 1 beside t=0.
func TestConcurrencyDenialStatesNoTime(t *testing.T) {
	l, _ := counting.New(1)
	defer l.Close()
	var h http.Handler
	h = mw(t, l, httplimit.WithName("conc"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner := get(h, "192.0.2.1:1")
		if inner.Code != http.StatusTooManyRequests || inner.Header().Get("Retry-After") != "" ||
			inner.Header().Get("RateLimit") != `"conc";r=0` {
			t.Errorf("denied: %d, Retry-After %q, RateLimit %q; want 429, none, \"conc\";r=0",
				inner.Code, inner.Header().Get("Retry-After"), inner.Header().Get("RateLimit"))
		}
	}))
	if w := get(h, "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("first request: %d", w.Code)
	}
}
