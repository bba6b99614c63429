package throttleprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/extra/throttleprom"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestObserverScrape(t *testing.T) {
	obs := throttleprom.New(throttleprom.WithConstLabels(prometheus.Labels{"service": "api"}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)

	tb, err := tokenbucket.New(throttle.PerSecond(1), 3, throttle.WithClock(throttletest.NewClock()))
	if err != nil {
		t.Fatal(err)
	}
	l := throttle.Observe(tb, "login", obs)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Allow(ctx, "user-secret-key", 1)
	}
	l.Allow(ctx, "", 1) // error: empty key
	obs.Observe(throttle.Event{Kind: throttle.EventError, Limiter: "rules", Err: throttle.ErrDenied})
	obs.Observe(throttle.Event{Kind: throttle.EventFallback, Limiter: "redis", Decision: throttle.Decision{Allowed: true}, Err: throttle.ErrUnavailable})
	obs.Observe(throttle.Event{Kind: throttle.EventBreakerOpen, Limiter: "redis"})
	obs.Observe(throttle.Event{Kind: throttle.EventWarning, Limiter: "redis", Err: errors.New("no persistence")})

	want := `
# HELP throttle_decisions_total Calls to a limiter by outcome: allowed, denied or error.
# TYPE throttle_decisions_total counter
throttle_decisions_total{limiter="login",outcome="allowed",service="api"} 3
throttle_decisions_total{limiter="login",outcome="denied",service="api"} 2
throttle_decisions_total{limiter="login",outcome="error",service="api"} 1
throttle_decisions_total{limiter="redis",outcome="allowed",service="api"} 0
throttle_decisions_total{limiter="redis",outcome="denied",service="api"} 0
throttle_decisions_total{limiter="redis",outcome="error",service="api"} 0
throttle_decisions_total{limiter="rules",outcome="allowed",service="api"} 0
throttle_decisions_total{limiter="rules",outcome="denied",service="api"} 1
throttle_decisions_total{limiter="rules",outcome="error",service="api"} 0
# HELP throttle_breaker_open 1 while the limiter's circuit breaker is open, else 0.
# TYPE throttle_breaker_open gauge
throttle_breaker_open{limiter="redis",service="api"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "throttle_decisions_total", "throttle_breaker_open"); err != nil {
		t.Fatal(err)
	}
	obs.Observe(throttle.Event{Kind: throttle.EventBreakerClosed, Limiter: "redis"})

	// Scrape over HTTP as Prometheus would.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`throttle_fallbacks_total{limiter="redis",outcome="allowed",service="api"} 1`,
		`throttle_warnings_total{limiter="redis",service="api"} 1`,
		`throttle_breaker_open{limiter="redis",service="api"} 0`,
	} {
		if !strings.Contains(string(body), line) {
			t.Errorf("scrape lacks %s", line)
		}
	}
	if strings.Contains(string(body), "user-secret-key") {
		t.Error("a key leaked into a label")
	}
	if n := testutil.CollectAndCount(obs); n != 3*7+2 {
		t.Errorf("%d series, want 23 (7 per limiter, and redis's fallback and breaker)", n)
	}
}

// Failures are split into the callers' mistakes and the backend's
// failures; measured round trips go to the latency histogram.
func TestErrorClassesAndLatency(t *testing.T) {
	obs := throttleprom.New(throttleprom.WithLatencyBuckets(0.001, 0.01))
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	wrap := func(err error) error { return fmt.Errorf("redis: %w", err) }
	for _, e := range []throttle.Event{
		{Kind: throttle.EventError, Err: wrap(throttle.ErrInvalid), Latency: 500 * time.Microsecond},
		{Kind: throttle.EventError, Err: wrap(throttle.ErrExceedsLimit)},
		{Kind: throttle.EventError, Err: wrap(throttle.ErrUnavailable), Latency: 5 * time.Millisecond},
		{Kind: throttle.EventFallback, Err: wrap(throttle.ErrUnavailable), Latency: 50 * time.Millisecond},
		{Kind: throttle.EventError, Err: wrap(throttle.ErrClosed)},
		{Kind: throttle.EventError, Err: wrap(throttle.ErrDenied)},
		{Kind: throttle.EventDecision, Decision: throttle.Decision{Allowed: true}, Latency: 700 * time.Microsecond},
		{Kind: throttle.EventLimit, Latency: time.Second}, // a window's mean, not a call
	} {
		e.Limiter = "redis"
		obs.Observe(e)
	}
	want := `
# HELP throttle_errors_total Failed calls by class: client, backend or other.
# TYPE throttle_errors_total counter
throttle_errors_total{class="backend",limiter="redis"} 1
throttle_errors_total{class="client",limiter="redis"} 2
throttle_errors_total{class="other",limiter="redis"} 1
# HELP throttle_backend_latency_seconds How long calls to the limiter took, where they are timed: round trips to its backend.
# TYPE throttle_backend_latency_seconds histogram
throttle_backend_latency_seconds_bucket{limiter="redis",le="0.001"} 2
throttle_backend_latency_seconds_bucket{limiter="redis",le="0.01"} 3
throttle_backend_latency_seconds_bucket{limiter="redis",le="+Inf"} 4
throttle_backend_latency_seconds_sum{limiter="redis"} 0.0562
throttle_backend_latency_seconds_count{limiter="redis"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "throttle_errors_total", "throttle_backend_latency_seconds"); err != nil {
		t.Fatal(err)
	}
}

// Units held through throttle.Observe show in throttle_in_flight until
// released, and WithLatency times each call.
func TestInFlightAndTimedCalls(t *testing.T) {
	obs := throttleprom.New(throttleprom.WithLatency())
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	sem, err := counting.NewSemaphore(3)
	if err != nil {
		t.Fatal(err)
	}
	h := throttle.Observe(sem, "db", obs).(throttle.Holder)
	ctx := context.Background()
	_, r1, _ := h.TryHold(ctx, "", 2)
	_, r2, _ := h.TryHold(ctx, "", 1)
	_, r3, _ := h.TryHold(ctx, "", 1) // full: holds nothing
	// value is the gauge's value, or the histogram's count, of the
	// metric name of limiter "db".
	value := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			m := mf.GetMetric()[0]
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetGauge().GetValue()
		}
		t.Fatalf("no %s", name)
		return 0
	}
	if v := value("throttle_in_flight"); v != 3 {
		t.Fatalf("in flight %v after holding 2 and 1, want 3", v)
	}
	r1()
	r1() // a second release gives back nothing
	r3()
	if v := value("throttle_in_flight"); v != 1 {
		t.Fatalf("in flight %v after releasing the 2, want 1", v)
	}
	r2()
	if v := value("throttle_in_flight"); v != 0 {
		t.Fatalf("in flight %v after releasing all, want 0", v)
	}
	if v := value("throttle_backend_latency_seconds"); v != 3 {
		t.Fatalf("%v calls timed, want 3", v)
	}
}

// A rules limiter's reloads are counted, and throttle_config_info names
// the version in force, one series per limiter.
func TestReloads(t *testing.T) {
	obs := throttleprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	for _, v := range []string{"v1", "v2"} {
		obs.Observe(throttle.Event{Kind: throttle.EventReload, Limiter: "tiers", Key: v})
	}
	obs.Observe(throttle.Event{Kind: throttle.EventWarning, Limiter: "tiers", Err: errors.New("rejected")})
	want := `
# HELP throttle_config_info 1 for the version of the configuration in force.
# TYPE throttle_config_info gauge
throttle_config_info{limiter="tiers",version="v2"} 1
# HELP throttle_reloads_total Configurations put in force (a rejected one is a warning).
# TYPE throttle_reloads_total counter
throttle_reloads_total{limiter="tiers"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "throttle_config_info", "throttle_reloads_total"); err != nil {
		t.Fatal(err)
	}
}

func TestObserveAllocs(t *testing.T) {
	obs := throttleprom.New()
	for _, e := range []throttle.Event{
		{Kind: throttle.EventDecision, Limiter: "api", Key: "k", N: 1, Decision: throttle.Decision{Allowed: true}},
		{Kind: throttle.EventError, Limiter: "api", Key: "k", N: 1, Err: throttle.ErrUnavailable, Latency: time.Millisecond},
	} {
		obs.Observe(e)
		if n := testing.AllocsPerRun(1000, func() { obs.Observe(e) }); n != 0 {
			t.Fatalf("Observe(%v): %v allocs", e.Kind, n)
		}
	}
}

func BenchmarkObserve(b *testing.B) {
	reporttest.BenchObserve(b, throttleprom.New(),
		throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Key: "k", N: 1, Decision: throttle.Decision{Allowed: true}})
}

// The whole path: an observed token bucket.
func BenchmarkObservedAllow(b *testing.B) {
	obs := throttleprom.New()
	tb, _ := tokenbucket.New(throttle.PerSecond(1e9), 1<<30)
	l := throttle.Observe(tb, "api", obs)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow(ctx, "k", 1)
		}
	})
}

// A store that is down, behind failsafe's default FailClosed policy with
// the Observer given to WithObserver: each refused call counts once as an
// "error" decision, once as a "denied" fallback, and once as a backend
// error, as the package documents.
func TestFailClosedCountsAsFallback(t *testing.T) {
	obs := throttleprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, fmt.Errorf("%w: connection refused", throttle.ErrUnavailable)
	})
	l, err := failsafe.New(down, failsafe.WithObserver("store", obs))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrUnavailable) {
			t.Fatalf("refusal: %v", err)
		}
	}
	want := `
# HELP throttle_decisions_total Calls to a limiter by outcome: allowed, denied or error.
# TYPE throttle_decisions_total counter
throttle_decisions_total{limiter="store",outcome="allowed"} 0
throttle_decisions_total{limiter="store",outcome="denied"} 0
throttle_decisions_total{limiter="store",outcome="error"} 3
# HELP throttle_fallbacks_total Calls decided by a failure policy because the backend failed, by outcome.
# TYPE throttle_fallbacks_total counter
throttle_fallbacks_total{limiter="store",outcome="denied"} 3
# HELP throttle_errors_total Failed calls by class: client, backend or other.
# TYPE throttle_errors_total counter
throttle_errors_total{class="backend",limiter="store"} 3
throttle_errors_total{class="client",limiter="store"} 0
throttle_errors_total{class="other",limiter="store"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "throttle_decisions_total", "throttle_fallbacks_total", "throttle_errors_total"); err != nil {
		t.Fatal(err)
	}
}

// TestOnlySeriesThatMove: a limiter exports the series its events can
// move: a token bucket without timing, its decisions, errors and warnings
// (7 series), no latency histogram, breaker, fallback, in-flight or
// reload series. Before, every limiter got all of them: 13 metrics (35
// series, 17 of them a latency histogram that stays at zero). An adaptive limit's
// changes and a retry policy's events are exported (before: dropped).
func TestOnlySeriesThatMove(t *testing.T) {
	obs := throttleprom.New()
	tb, err := tokenbucket.New(throttle.PerSecond(1), 3, throttle.WithClock(throttletest.NewClock()))
	if err != nil {
		t.Fatal(err)
	}
	l := throttle.Observe(tb, "login", obs)
	for range 5 {
		l.Allow(context.Background(), "k", 1)
	}
	if n := testutil.CollectAndCount(obs); n != 7 {
		t.Errorf("a token bucket exports %d series, want 7", n)
	}
	obs.Observe(throttle.Event{Kind: throttle.EventLimit, Limiter: "backend", Decision: throttle.Decision{Limit: 42}, N: 7})
	obs.Observe(throttle.Event{Kind: throttle.EventRetry, Limiter: "client", N: 1, Decision: throttle.Decision{Allowed: true}})
	obs.Observe(throttle.Event{Kind: throttle.EventRetry, Limiter: "client", N: 3})
	want := `
# HELP throttle_limit The limit an adaptive limiter set last.
# TYPE throttle_limit gauge
throttle_limit{limiter="backend"} 42
# HELP throttle_retries_total Failures a retry policy judged retryable, by outcome: retried or refused.
# TYPE throttle_retries_total counter
throttle_retries_total{limiter="client",outcome="refused"} 1
throttle_retries_total{limiter="client",outcome="retried"} 1
`
	if err := testutil.CollectAndCompare(obs, strings.NewReader(want), "throttle_limit", "throttle_retries_total"); err != nil {
		t.Error(err)
	}
}

// TestNamespace: WithNamespace prefixes every metric's name.
func TestNamespace(t *testing.T) {
	obs := throttleprom.New(throttleprom.WithNamespace("edge"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	obs.Observe(throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Decision: throttle.Decision{Allowed: true}})
	want := `
# HELP edge_decisions_total Calls to a limiter by outcome: allowed, denied or error.
# TYPE edge_decisions_total counter
edge_decisions_total{limiter="api",outcome="allowed"} 1
edge_decisions_total{limiter="api",outcome="denied"} 0
edge_decisions_total{limiter="api",outcome="error"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "edge_decisions_total"); err != nil {
		t.Fatal(err)
	}
}
