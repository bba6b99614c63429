package obskit_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/obskit"
)

func TestOf(t *testing.T) {
	for _, c := range []struct {
		e    throttle.Event
		want obskit.Outcome
	}{
		{throttle.Event{Kind: throttle.EventDecision, Decision: throttle.Decision{Allowed: true}}, obskit.Allowed},
		{throttle.Event{Kind: throttle.EventDecision}, obskit.Denied},
		{throttle.Event{Kind: throttle.EventError, Err: fmt.Errorf("x: %w", throttle.ErrDenied)}, obskit.Denied},
		{throttle.Event{Kind: throttle.EventError, Err: throttle.ErrUnavailable}, obskit.Errored},
		{throttle.Event{Kind: throttle.EventFallback, Decision: throttle.Decision{Allowed: true}}, obskit.FallbackAllowed},
		{throttle.Event{Kind: throttle.EventFallback}, obskit.FallbackDenied},
		{throttle.Event{Kind: throttle.EventBreakerOpen}, obskit.BreakerOpen},
		{throttle.Event{Kind: throttle.EventBreakerClosed}, obskit.BreakerClosed},
		{throttle.Event{Kind: throttle.EventWarning}, obskit.Warning},
		{throttle.Event{Kind: 200}, obskit.None},
	} {
		if got := obskit.Of(c.e); got != c.want {
			t.Errorf("Of(%v) = %v, want %v", c.e.Kind, got, c.want)
		}
	}
}

func TestCache(t *testing.T) {
	var builds atomic.Int32
	c := obskit.NewCache(func(name string) string { builds.Add(1); return "v-" + name })
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				if got := c.Get(fmt.Sprint(i % 5)); got != fmt.Sprintf("v-%d", i%5) {
					t.Errorf("Get = %q", got)
				}
			}
		}()
	}
	wg.Wait()
	if builds.Load() != 5 {
		t.Fatalf("%d builds, want 5", builds.Load())
	}
	if n := testing.AllocsPerRun(100, func() { c.Get("3") }); n != 0 {
		t.Fatalf("Get: %v allocs", n)
	}
}

func TestClassOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("redis: %w", err) }
	for _, c := range []struct {
		e    throttle.Event
		want obskit.ErrorClass
	}{
		{throttle.Event{Kind: throttle.EventDecision}, obskit.NoError},
		{throttle.Event{Kind: throttle.EventWarning, Err: throttle.ErrUnavailable}, obskit.NoError},
		{throttle.Event{Kind: throttle.EventError, Err: wrap(throttle.ErrDenied)}, obskit.NoError},
		{throttle.Event{Kind: throttle.EventError, Err: wrap(throttle.ErrInvalid)}, obskit.ClientError},
		{throttle.Event{Kind: throttle.EventError, Err: wrap(throttle.ErrExceedsLimit)}, obskit.ClientError},
		{throttle.Event{Kind: throttle.EventError, Err: wrap(throttle.ErrUnavailable)}, obskit.BackendError},
		{throttle.Event{Kind: throttle.EventFallback, Err: wrap(throttle.ErrUnavailable)}, obskit.NoError}, // counted as its call's
		{throttle.Event{Kind: throttle.EventError, Err: wrap(throttle.ErrClosed)}, obskit.OtherError},
	} {
		if got := obskit.ClassOf(c.e); got != c.want {
			t.Errorf("ClassOf(%v %v) = %d, want %d", c.e.Kind, c.e.Err, got, c.want)
		}
	}
}
