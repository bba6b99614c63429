package throttleprom_test

import (
	"context"
	"errors"
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
	"github.com/throttlekit/throttle/extra/throttleprom"
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
throttle_breaker_open{limiter="login",service="api"} 0
throttle_breaker_open{limiter="redis",service="api"} 1
throttle_breaker_open{limiter="rules",service="api"} 0
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
	if n := testutil.CollectAndCount(obs); n != 3*3+3*2+3+3 {
		t.Errorf("%d series, want 21 (7 per limiter)", n)
	}
}

func TestObserveAllocs(t *testing.T) {
	obs := throttleprom.New()
	e := throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Key: "k", N: 1, Decision: throttle.Decision{Allowed: true}}
	obs.Observe(e)
	if n := testing.AllocsPerRun(1000, func() { obs.Observe(e) }); n != 0 {
		t.Fatalf("Observe: %v allocs", n)
	}
}

func BenchmarkObserve(b *testing.B) {
	obs := throttleprom.New()
	e := throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Key: "k", N: 1, Decision: throttle.Decision{Allowed: true}}
	obs.Observe(e)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.Observe(e)
		}
	})
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
