package redislimit

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
)

// events is an Observer that records events.
type events struct {
	mu sync.Mutex
	es []throttle.Event
}

func (r *events) Observe(e throttle.Event) {
	r.mu.Lock()
	r.es = append(r.es, e)
	r.mu.Unlock()
}

// count returns how many events of kind k were recorded under name.
func (r *events) count(k throttle.EventKind, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.es {
		if e.Kind == k && e.Limiter == name {
			n++
		}
	}
	return n
}

// TestObserverBreakerAndFallback: with Redis killed, the breaker's
// opening is reported once, every request the failure policy decides is
// reported as a fallback, and the breaker's closing once Redis is back.
func TestObserverBreakerAndFallback(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	var obs events
	l, err := NewTokenBucket(c, throttle.PerSecond(1000), 1000, WithPrefix(uniquePrefix()),
		WithTimeout(faultTimeout), WithBreaker(3, cooldown), WithPolicy(FailOpen), WithObserver("api", &obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, _, err := call(t, l, "k"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 10 {
		call(t, l, "k")
	}
	if n := obs.count(throttle.EventBreakerOpen, "api"); n != 1 {
		t.Errorf("%d breaker-open events, want 1", n)
	}
	if n := obs.count(throttle.EventFallback, "api"); n != 10 {
		t.Errorf("%d fallback events for 10 requests decided by FailOpen, want 10", n)
	}
	srv.Restart(t)
	// FailOpen hides the outage from callers: call until the breaker's
	// probe gets through.
	for deadline := time.Now().Add(5 * time.Second); obs.count(throttle.EventBreakerClosed, "api") == 0 && time.Now().Before(deadline); {
		call(t, l, "k")
		time.Sleep(10 * time.Millisecond)
	}
	if n := obs.count(throttle.EventBreakerClosed, "api"); n != 1 {
		t.Errorf("%d breaker-closed events, want 1", n)
	}
}

// TestEvictionPolicyWarning: a server that may evict limiter keys
// (maxmemory with allkeys-lru) is reported once, on the first call, to the
// observer and the error handler; a server that never evicts is not.
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
		var obs events
		var handled []string
		l, err := NewFixedWindow(c, 10, 60e9, WithPrefix(uniquePrefix()), WithObserver("w", &obs),
			WithErrorHandler(func(err error) { handled = append(handled, err.Error()) }))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := l.Allow(t.Context(), "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		if n := obs.count(throttle.EventWarning, "w"); n != tc.want {
			t.Errorf("%v: %d warnings, want %d", tc.args, n, tc.want)
		}
		if len(handled) != tc.want || tc.want > 0 && !strings.Contains(handled[0], "allkeys-lru") {
			t.Errorf("%v: error handler got %q", tc.args, handled)
		}
		l.Close()
	}
}
