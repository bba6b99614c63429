package redislimit

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestObserverBreakerAndFallback: with Redis killed, the breaker's
// opening is reported once, every request the failure policy decides is
// reported as a fallback, and the breaker's closing once Redis is back.
func TestObserverBreakerAndFallback(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	var obs reporttest.Recorder
	l := faultBucket(t, c, WithBreaker(3, cooldown), WithPolicy(failsafe.Open), WithObserver("api", &obs))
	srv.Kill()
	for range 10 {
		call(t, l, "k")
	}
	if n := obs.Count(throttle.EventBreakerOpen, "api"); n != 1 {
		t.Errorf("%d breaker-open events, want 1", n)
	}
	if n := obs.Count(throttle.EventFallback, "api"); n != 10 {
		t.Errorf("%d fallback events for 10 requests decided by failsafe.Open, want 10", n)
	}
	srv.Restart(t)
	// failsafe.Open hides the outage from callers: call until the breaker's
	// probe gets through.
	for deadline := time.Now().Add(5 * time.Second); obs.Count(throttle.EventBreakerClosed, "api") == 0 && time.Now().Before(deadline); {
		call(t, l, "k")
		time.Sleep(10 * time.Millisecond)
	}
	if n := obs.Count(throttle.EventBreakerClosed, "api"); n != 1 {
		t.Errorf("%d breaker-closed events, want 1", n)
	}
}

// TestEvictionPolicyWarning: a server that may evict limiter keys
// (maxmemory with allkeys-lru) is reported once, on the first call, to the
// observer and the error func; a server that never evicts is not.
func TestEvictionPolicyWarning(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}, 1},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"}, 0},
		{nil, 0},
	} {
		srv := redistest.Start(t, tc.args...)
		if tc.args != nil {
			srv.NeedOwn(t)
		}
		c := newClient(t, srv)
		var obs reporttest.Recorder
		l, err := NewFixedWindow(c, 10, 60e9, WithPrefix(uniquePrefix()), WithObserver("w", &obs))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := l.Allow(t.Context(), "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		if n := obs.Count(throttle.EventWarning, "w"); n != tc.want {
			t.Errorf("%v: %d warnings, want %d", tc.args, n, tc.want)
		}
		for _, e := range obs.Events() {
			if e.Kind == throttle.EventWarning && !strings.Contains(e.Err.Error(), "allkeys-lru") {
				t.Errorf("%v: warning %v", tc.args, e.Err)
			}
		}
		l.Close()
	}
}

// TestEveryCallReported: every limiter of the package reports each of its
// calls to its observer once, as throttle.Observe does, and each call its
// failure policy decided as a fallback too (a failsafe.Closed refusal
// included), with Redis up and with Redis refusing connections.
func TestEveryCallReported(t *testing.T) {
	srv := redistest.Start(t)
	up := newClient(t, srv)
	down := refusingClient(t)
	ctx := t.Context()

	type closer interface {
		throttle.Limiter
		Close() error
	}
	// limiter makes l with the observer, closed at the test's end.
	limiter := func(t *testing.T, l closer, err error) closer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	// A timeout generous for a loaded machine: a call to the Redis that
	// is up must not fail (the cases of the one that is down set theirs).
	opts := func(name string, o throttle.Observer, more ...Option) []Option {
		return append([]Option{WithPrefix(uniquePrefix()), WithObserver(name, o), WithTimeout(5 * time.Second)}, more...)
	}
	// every makes call i through each method l has, in turn; key "" for
	// i = 1, a call that fails.
	every := func(l throttle.Limiter) func(int) error {
		return func(i int) error {
			key := "k"
			if i == 1 {
				key = ""
			}
			m := []throttle.Method{throttle.MethodAllow, throttle.MethodAllowQuota, throttle.MethodReserve}[i%3]
			_, err := throttle.Invoke(ctx, l, throttle.Call{Method: m, Key: key, N: 1, Rate: throttle.PerHour(1), Burst: 3, MaxWait: time.Hour})
			return err
		}
	}
	allow := func(l throttle.Limiter) func(int) error {
		return func(int) error { _, err := l.Allow(ctx, "k", 1); return err }
	}
	local, err := tokenbucket.New(throttle.PerHour(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	reporttest.Run(t, []reporttest.Case{
		{Name: "Bucket", Calls: 12, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewTokenBucket(up, throttle.PerHour(1), 3, opts(name, o)...)
			return every(limiter(t, l, err))
		}},
		{Name: "Bucket-leasing", Calls: 12, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewTokenBucket(up, throttle.PerHour(1), 3, opts(name, o, WithLeasing(2, time.Second))...)
			return every(limiter(t, l, err))
		}},
		{Name: "FixedWindow", Calls: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewFixedWindow(up, 3, time.Hour, opts(name, o)...)
			return allow(limiter(t, l, err))
		}},
		{Name: "SlidingWindow", Calls: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewSlidingWindow(up, 3, time.Hour, opts(name, o)...)
			return allow(limiter(t, l, err))
		}},
		{Name: "SlidingLog", Calls: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewSlidingLog(up, 3, time.Hour, opts(name, o)...)
			return allow(limiter(t, l, err))
		}},
		{Name: "Concurrency", Calls: 6, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			c, err := NewConcurrency(up, 2, time.Minute, opts(name, o)...)
			l := limiter(t, c, err)
			return func(i int) error {
				d, err := l.Allow(ctx, "k", 1)
				if d.Allowed && i%2 == 0 {
					err = c.Release(ctx, "k", 1)
				}
				return err
			}
		}},
		{Name: "failsafe.Closed", Calls: 10, Fallbacks: 10, Refused: 10, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewFixedWindow(down, 3, time.Hour, opts(name, o, WithBreaker(3, time.Hour), WithTimeout(faultTimeout))...)
			return allow(limiter(t, l, err))
		}},
		{Name: "failsafe.Closed-Reserve", Calls: 10, Fallbacks: 10, Refused: 10, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			b, err := NewTokenBucket(down, throttle.PerHour(1), 3, opts(name, o, WithBreaker(3, time.Hour), WithTimeout(faultTimeout))...)
			l := limiter(t, b, err)
			return func(int) error { _, err := l.(throttle.Reserver).Reserve(ctx, "k", 1, time.Hour); return err }
		}},
		{Name: "failsafe.Open", Calls: 10, Fallbacks: 10, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewSlidingWindow(down, 3, time.Hour, opts(name, o, WithBreaker(3, time.Hour), WithTimeout(faultTimeout), WithPolicy(failsafe.Open))...)
			return allow(limiter(t, l, err))
		}},
		{Name: "failsafe.Fallback", Calls: 10, Fallbacks: 10, Refused: 7, Breaker: true, New: func(t *testing.T, name string, o throttle.Observer) func(int) error {
			l, err := NewTokenBucket(down, throttle.PerHour(1), 3, opts(name, o, WithBreaker(3, time.Hour), WithTimeout(faultTimeout), WithFallback(local))...)
			return allow(limiter(t, l, err))
		}},
	})
}
