package throttleotel_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/throttleotel"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]map[attribute.Distinct]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[attribute.Distinct]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != throttleotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			vals := map[attribute.Distinct]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					vals[p.Attributes.Equivalent()] = p.Value
					if _, ok := p.Attributes.Value("key"); ok {
						t.Error("a key became an attribute")
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					vals[p.Attributes.Equivalent()] = p.Value
				}
			default:
				t.Errorf("%s: unexpected %T", m.Name, m.Data)
			}
			out[m.Name] = vals
		}
	}
	return out
}

func attrs(limiter, outcome string) attribute.Distinct {
	kv := []attribute.KeyValue{attribute.String("limiter", limiter)}
	if outcome != "" {
		kv = append(kv, attribute.String("outcome", outcome))
	}
	s := attribute.NewSet(kv...)
	return s.Equivalent()
}

func TestObserver(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := throttleotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := tokenbucket.New(throttle.PerSecond(1), 3, throttle.WithClock(throttletest.NewClock()))
	l := throttle.Observe(tb, "login", obs)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		l.Allow(ctx, "user-secret-key", 1)
	}
	l.Allow(ctx, "", 1)
	obs.Observe(throttle.Event{Kind: throttle.EventError, Limiter: "rules", Err: throttle.ErrDenied})
	obs.Observe(throttle.Event{Kind: throttle.EventFallback, Limiter: "redis", Err: throttle.ErrUnavailable})
	obs.Observe(throttle.Event{Kind: throttle.EventBreakerOpen, Limiter: "redis"})
	obs.Observe(throttle.Event{Kind: throttle.EventWarning, Limiter: "redis", Err: errors.New("no persistence")})

	got := collect(t, reader)
	want := map[string]map[attribute.Distinct]int64{
		"throttle.decisions": {
			attrs("login", "allowed"): 3, attrs("login", "denied"): 2, attrs("login", "error"): 1,
			attrs("rules", "denied"): 1,
		},
		"throttle.fallbacks":    {attrs("redis", "denied"): 1},
		"throttle.warnings":     {attrs("redis", ""): 1},
		"throttle.breaker.open": {attrs("redis", ""): 1},
	}
	for name, w := range want {
		for a, v := range w {
			if got[name][a] != v {
				t.Errorf("%s%v = %d, want %d (all: %v)", name, a, got[name][a], v, got[name])
			}
		}
		if len(got[name]) != len(w) {
			t.Errorf("%s has %d series, want %d", name, len(got[name]), len(w))
		}
	}
	obs.Observe(throttle.Event{Kind: throttle.EventBreakerClosed, Limiter: "redis"})
	if v := collect(t, reader)["throttle.breaker.open"][attrs("redis", "")]; v != 0 {
		t.Errorf("breaker after close = %d", v)
	}
	if _, err := throttleotel.New(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
}

// With a no-op provider the observer path allocates nothing.
func TestObserveAllocsNoop(t *testing.T) {
	obs, _ := throttleotel.New(noop.NewMeterProvider())
	e := throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Decision: throttle.Decision{Allowed: true}}
	obs.Observe(e)
	if n := testing.AllocsPerRun(1000, func() { obs.Observe(e) }); n != 0 {
		t.Fatalf("Observe: %v allocs", n)
	}
}

func BenchmarkObserve(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, _ := throttleotel.New(mp)
	reporttest.BenchObserve(b, obs, throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Decision: throttle.Decision{Allowed: true}})
}

// With the SDK, too, once the limiter's name has been seen.
func TestObserveAllocsSDK(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	obs, _ := throttleotel.New(mp)
	e := throttle.Event{Kind: throttle.EventDecision, Limiter: "api", Decision: throttle.Decision{Allowed: true}}
	obs.Observe(e)
	if n := testing.AllocsPerRun(1000, func() { obs.Observe(e) }); n != 0 {
		t.Fatalf("Observe: %v allocs", n)
	}
}
