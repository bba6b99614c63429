package report_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/tokenbucket"
)

var ctx = context.Background()

// bucket is a keyed token bucket of burst 3 that never refills in a test.
func bucket(t *testing.T) *tokenbucket.Limiter {
	l, err := tokenbucket.New(throttle.NewRate(1, time.Hour), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func semaphore(t *testing.T) *counting.Semaphore {
	s, err := counting.NewSemaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// down is a store that has failed.
var down = throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
	return throttle.Decision{}, fmt.Errorf("%w: connection refused", throttle.ErrUnavailable)
})

// every makes call i through each method l has, in turn (see
// limiterkit.Invoke), giving held units back at once; key "" for i = 1,
// a call that fails.
func every(l throttle.Limiter) func(i int) error {
	return func(i int) error {
		key := "k"
		if i == 1 {
			key = ""
		}
		m := []limiterkit.Method{limiterkit.MethodAllow, limiterkit.MethodAllowQuota, limiterkit.MethodTryHold, limiterkit.MethodReserve}[i%4]
		r, err := limiterkit.Invoke(ctx, l, limiterkit.Call{Method: m, Key: key, N: 1, Rate: throttle.NewRate(1, time.Hour), Burst: 3})
		if r.Release != nil {
			r.Release()
		}
		return err
	}
}

// hold takes a unit of l and gives it back.
func hold(l throttle.Limiter) func(int) error {
	return func(int) error {
		_, release, err := throttle.TryHold(ctx, l, "k", 1)
		release()
		return err
	}
}

func failsafeOf(t *testing.T, inner throttle.Limiter, opts ...failsafe.Option) throttle.Limiter {
	l, err := failsafe.New(inner, append(opts, failsafe.WithBreaker(3, time.Hour, time.Hour))...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestEveryCallReported: every limiter and wrapper of the root module that
// takes an observer reports each of its calls once, as throttle.Observe
// does, and its own events beside them.
func TestEveryCallReported(t *testing.T) {
	reporttest.Run(t, []reporttest.Case{
		{Name: "Observe", Calls: 12, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return every(throttle.Observe(bucket(t), name, o))
		}},
		{Name: "Observe-holder", Calls: 6, Releases: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return hold(throttle.Observe(semaphore(t), name, o))
		}},
		{Name: "failsafe", Calls: 12, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return every(failsafeOf(t, bucket(t), failsafe.WithObserver(name, o)))
		}},
		{Name: "failsafe-holder", Calls: 6, Releases: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return hold(failsafeOf(t, semaphore(t), failsafe.WithObserver(name, o)))
		}},
		{Name: "failsafe-closed", Calls: 10, Fallbacks: 10, Refused: 10, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l := failsafeOf(t, down, failsafe.WithObserver(name, o))
			return func(int) error { _, err := l.Allow(ctx, "k", 1); return err }
		}},
		{Name: "failsafe-open", Calls: 10, Fallbacks: 10, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l := failsafeOf(t, down, failsafe.WithPolicy(failsafe.Open), failsafe.WithObserver(name, o))
			return func(int) error { _, err := l.Allow(ctx, "k", 1); return err }
		}},
		{Name: "failsafe-fallback", Calls: 10, Fallbacks: 10, Refused: 7, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l := failsafeOf(t, down, failsafe.WithFallback(bucket(t)), failsafe.WithObserver(name, o))
			return func(int) error { _, err := l.Allow(ctx, "k", 1); return err }
		}},
		{Name: "adaptive", Calls: 12, Releases: 3, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := adaptive.New(&adaptive.AIMD{}, adaptive.Config{Initial: 100, Min: 100, Max: 100, Name: name, Observer: o})
			if err != nil {
				t.Fatal(err)
			}
			return every(l)
		}},
		{Name: "adaptive-keyed", Calls: 12, Releases: 3, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := adaptive.NewKeyed(func() adaptive.Algorithm { return &adaptive.AIMD{} }, adaptive.Config{Initial: 100, Min: 100, Max: 100, Name: name, Observer: o})
			if err != nil {
				t.Fatal(err)
			}
			return every(l)
		}},
		{Name: "rules", Calls: 12, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			c, err := rules.Parse([]byte(`{"default": {"rate": "1/h", "burst": 3}, "deny": {"keys": ["bad"]}}`))
			if err != nil {
				t.Fatal(err)
			}
			l, err := rules.New(c, rules.WithObserver(name, o))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return func(i int) error {
				key := []string{"k", "bad", "k"}[i%3] // a deny list's refusal is an EventError
				if i%2 == 0 {
					_, err := l.Allow(ctx, key, 1)
					return err
				}
				_, err := l.Reserve(ctx, key, 1, 0)
				return err
			}
		}},
		{Name: "httplimit", Calls: 8, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return serve(t, bucket(t), false, httplimit.WithObserver(name, o))
		}},
		{Name: "httplimit-holder", Calls: 6, Releases: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return serve(t, semaphore(t), false, httplimit.WithObserver(name, o))
		}},
		{Name: "httplimit-context-limit", Calls: 8, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			return serve(t, bucket(t), true, httplimit.WithLimitFromContext(), httplimit.WithObserver(name, o))
		}},
	})
}

// serve returns a call that sends a request through the middleware of l,
// under a limit of its own when ctxLimit; a request the middleware
// answers with 503 or 400 is a call that failed.
func serve(t *testing.T, l throttle.Limiter, ctxLimit bool, opts ...httplimit.Option) func(int) error {
	mw, err := httplimit.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return func(int) error {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if ctxLimit {
			r = r.WithContext(httplimit.WithRequestLimit(r.Context(), throttle.NewRate(1, time.Hour), 2))
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 || w.Code == http.StatusBadRequest {
			return fmt.Errorf("status %d", w.Code)
		}
		return nil
	}
}
