package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// full is a limiter with every ability, recording each call it gets and
// what was given back.
type full struct {
	mu       sync.Mutex
	calls    []limiterkit.Method
	released int
	canceled int
	fail     error // returned by every call when set
}

func (f *full) record(m limiterkit.Method) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, m)
	return f.fail
}

func (f *full) last() (limiterkit.Method, int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return 255, f.released, f.canceled
	}
	return f.calls[len(f.calls)-1], f.released, f.canceled
}

func (f *full) release() { f.mu.Lock(); f.released++; f.mu.Unlock() }

func (f *full) Allow(context.Context, string, int) (throttle.Decision, error) {
	err := f.record(limiterkit.MethodAllow)
	return throttle.Decision{Allowed: err == nil, Limit: 7}, err
}

func (f *full) AllowQuota(_ context.Context, _ string, _ int, _ throttle.Rate, burst int) (throttle.Decision, error) {
	err := f.record(limiterkit.MethodAllowQuota)
	return throttle.Decision{Allowed: err == nil, Limit: burst}, err
}

func (f *full) TryHold(context.Context, string, int) (throttle.Decision, func(), error) {
	if err := f.record(limiterkit.MethodTryHold); err != nil {
		return throttle.Decision{}, func() {}, err
	}
	return throttle.Decision{Allowed: true, Limit: 7}, f.release, nil
}

func (f *full) Hold(context.Context, string, int) (func(), error) {
	if err := f.record(limiterkit.MethodHold); err != nil {
		return func() {}, err
	}
	return f.release, nil
}

func (f *full) Reserve(context.Context, string, int, time.Duration) (throttle.Reservation, error) {
	if err := f.record(limiterkit.MethodReserve); err != nil {
		return throttle.Reservation{}, err
	}
	return throttle.BookedReservation(7, func() { f.mu.Lock(); f.canceled++; f.mu.Unlock() }), nil
}

func (f *full) Quota() throttle.Quota { return throttle.Quota{Limit: 7, Window: time.Second} }

// abilities is the mask of l's abilities, in Restrict's bits.
func abilities(l throttle.Limiter) int {
	m := 0
	if _, ok := l.(throttle.Reserver); ok {
		m |= 1
	}
	if _, ok := l.(throttle.Holder); ok {
		m |= 2
	}
	if _, ok := l.(throttle.QuotaReporter); ok {
		m |= 4
	}
	if _, ok := l.(throttle.QuotaAllower); ok {
		m |= 8
	}
	return m
}

// wrappers are every decorator of this module, each as a func over the
// limiter it wraps.
var wrappers = map[string]func(throttle.Limiter) (throttle.Limiter, error){
	"Observe": func(l throttle.Limiter) (throttle.Limiter, error) {
		return throttle.Observe(l, "x", throttle.ObserverFunc(func(throttle.Event) {})), nil
	},
	"failsafe.Closed": func(l throttle.Limiter) (throttle.Limiter, error) { return failsafe.New(l) },
	"failsafe.Open": func(l throttle.Limiter) (throttle.Limiter, error) {
		return failsafe.New(l, failsafe.WithPolicy(failsafe.Open))
	},
	"failsafe.Fallback": func(l throttle.Limiter) (throttle.Limiter, error) {
		return failsafe.New(l, failsafe.WithFallback(throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
			return throttle.Decision{Allowed: true}, nil
		})))
	},
	"Observe(failsafe)": func(l throttle.Limiter) (throttle.Limiter, error) {
		f, err := failsafe.New(l)
		return throttle.Observe(f, "x", throttle.ObserverFunc(func(throttle.Event) {})), err
	},
}

// TestWrappersKeepAbilities runs every wrapper over limiters of each of
// the 16 sets of abilities: the wrapped limiter has exactly the inner's
// abilities, each call reaches the inner through the same method, and
// what it holds or books is given back to the inner.
func TestWrappersKeepAbilities(t *testing.T) {
	ctx := context.Background()
	for name, wrap := range wrappers {
		for mask := range 16 {
			t.Run(fmt.Sprintf("%s/%04b", name, mask), func(t *testing.T) {
				f := &full{}
				inner := throttle.Restrict(f, mask)
				if got := abilities(inner); got != mask {
					t.Fatalf("Restrict: abilities %04b, want %04b", got, mask)
				}
				l, err := wrap(inner)
				if err != nil {
					t.Fatal(err)
				}
				if got := abilities(l); got != mask {
					t.Fatalf("wrapped: abilities %04b, want %04b", got, mask)
				}
				if u, ok := l.(interface{ Unwrap() throttle.Limiter }); !ok || u.Unwrap() == nil {
					t.Fatal("wrapped limiter has no Unwrap")
				}
				check := func(want limiterkit.Method, released, canceled int) {
					t.Helper()
					m, r, c := f.last()
					if m != want || r != released || c != canceled {
						t.Fatalf("inner saw %v (released %d, canceled %d); want %v (%d, %d)", m, r, c, want, released, canceled)
					}
				}
				if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
				check(limiterkit.MethodAllow, 0, 0)
				if r, ok := l.(throttle.Reserver); ok {
					res, err := r.Reserve(ctx, "k", 1, time.Second)
					if err != nil || !res.OK {
						t.Fatalf("Reserve: %+v, %v", res, err)
					}
					check(limiterkit.MethodReserve, 0, 0)
					res.Cancel()
					check(limiterkit.MethodReserve, 0, 1)
				}
				if h, ok := l.(throttle.Holder); ok {
					d, release, err := h.TryHold(ctx, "k", 1)
					if err != nil || !d.Allowed {
						t.Fatalf("TryHold: %+v, %v", d, err)
					}
					check(limiterkit.MethodTryHold, 0, f.canceled)
					release()
					check(limiterkit.MethodTryHold, 1, f.canceled)
					release, err = h.Hold(ctx, "k", 1)
					if err != nil {
						t.Fatalf("Hold: %v", err)
					}
					check(limiterkit.MethodHold, 1, f.canceled)
					release()
					check(limiterkit.MethodHold, 2, f.canceled)
				}
				if q, ok := l.(throttle.QuotaAllower); ok {
					if d, err := q.AllowQuota(ctx, "k", 1, throttle.PerSecond(3), 3); err != nil || d.Limit != 3 {
						t.Fatalf("AllowQuota: %+v, %v", d, err)
					}
					m, _, _ := f.last()
					if m != limiterkit.MethodAllowQuota {
						t.Fatalf("inner saw %v, want AllowQuota", m)
					}
				}
				if q, ok := l.(throttle.QuotaReporter); ok && q.Quota().Limit != 7 {
					t.Fatalf("Quota = %+v, want the inner's", q.Quota())
				}
			})
		}
	}
}

// TestFailsafeKeepsHolder is the case that lost held units: a semaphore
// behind failsafe under the HTTP middleware. Every sequential request
// must be served and nothing stay held.
func TestFailsafeKeepsHolder(t *testing.T) {
	sem, err := counting.NewSemaphore(2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := failsafe.New(sem)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(l)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i := range 5 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://x/", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, rec.Code)
		}
	}
	if n := sem.InFlight(); n != 0 {
		t.Fatalf("%d units still held", n)
	}
}

// TestFailsafeHolderOutage: with the store down, TryHold follows the
// policy and a Fallback Holder's units are released through the wrapper.
func TestFailsafeHolderOutage(t *testing.T) {
	down := &full{fail: fmt.Errorf("%w: down", throttle.ErrUnavailable)}
	fb, err := counting.NewSemaphore(1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := failsafe.New(throttle.Restrict(down, 2), failsafe.WithFallback(fb), failsafe.WithBreaker(0, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	h := l.(throttle.Holder)
	for i := range 3 {
		d, release, err := h.TryHold(context.Background(), "k", 1)
		if err != nil || !d.Allowed || fb.InFlight() != 1 {
			t.Fatalf("call %d: %+v, %v, fallback holds %d", i, d, err, fb.InFlight())
		}
		release()
		if fb.InFlight() != 0 {
			t.Fatalf("call %d: the fallback's unit was not released", i)
		}
	}
	closed, err := failsafe.New(throttle.Restrict(down, 2))
	if err != nil {
		t.Fatal(err)
	}
	if d, release, err := closed.(throttle.Holder).TryHold(context.Background(), "k", 1); d.Allowed || release == nil || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("Closed: %+v, %v", d, err)
	}
}

func TestNames(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{limiterkit.MethodAllow.String(), "Allow"},
		{limiterkit.MethodReserve.String(), "Reserve"},
		{limiterkit.Method(200).String(), "Method(?)"},
		{throttle.EventDecision.String(), "decision"},
		{throttle.EventError.String(), "error"},
		{throttle.EventFallback.String(), "fallback"},
		{throttle.EventBreakerOpen.String(), "breaker_open"},
		{throttle.EventBreakerClosed.String(), "breaker_closed"},
		{throttle.EventWarning.String(), "warning"},
		{throttle.EventLimit.String(), "limit"},
		{throttle.EventRetry.String(), "retry"},
		{throttle.EventRelease.String(), "release"},
		{throttle.EventReload.String(), "reload"},
		{throttle.EventKind(200).String(), "unknown"},
	} {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}
