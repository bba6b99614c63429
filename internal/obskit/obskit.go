// Package obskit is what the metrics adapters (Prometheus,
// OpenTelemetry) share: the outcome an Event counts as, and a per-limiter
// cache of resolved instruments whose lookups take no lock and allocate
// nothing.
package obskit

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttle"
)

// Outcome is what an Event counts as.
type Outcome uint8

// Outcomes.
const (
	None            Outcome = iota // an unknown kind: nothing to count
	Allowed                        // a decision that admitted
	Denied                         // a decision that refused, or a deny list
	Errored                        // a call that failed
	FallbackAllowed                // a failure policy admitted
	FallbackDenied                 // a failure policy refused
	BreakerOpen                    // the breaker opened
	BreakerClosed                  // the breaker closed
	Warning                        // a warning
	NumOutcomes
)

// Of returns the outcome e counts as. A call refused by a deny list (an
// error wrapping throttle.ErrDenied) counts as Denied.
func Of(e throttle.Event) Outcome {
	switch e.Kind {
	case throttle.EventDecision:
		if e.Decision.Allowed {
			return Allowed
		}
		return Denied
	case throttle.EventError:
		if errors.Is(e.Err, throttle.ErrDenied) {
			return Denied
		}
		return Errored
	case throttle.EventFallback:
		if e.Decision.Allowed {
			return FallbackAllowed
		}
		return FallbackDenied
	case throttle.EventBreakerOpen:
		return BreakerOpen
	case throttle.EventBreakerClosed:
		return BreakerClosed
	case throttle.EventWarning:
		return Warning
	}
	return None
}

// ErrorClass is what a failure counts as, for a dashboard to tell the
// callers' mistakes from the backend's failures.
type ErrorClass uint8

// Error classes.
const (
	NoError      ErrorClass = iota // not a failure (or a deny list: Denied)
	ClientError                    // throttle.ErrInvalid or ErrExceedsLimit: the call was wrong
	BackendError                   // throttle.ErrUnavailable: the backend failed
	OtherError                     // anything else (a closed limiter, a cancelled context)
	NumErrorClasses
)

// ClassOf returns the class of the error of an EventError: a call that
// failed. It is NoError for other Events (an EventFallback's backend
// error comes beside the call's own Event, counted there when the call
// failed) and for a deny list (an error wrapping throttle.ErrDenied).
func ClassOf(e throttle.Event) ErrorClass {
	if e.Err == nil || e.Kind != throttle.EventError ||
		errors.Is(e.Err, throttle.ErrDenied) {
		return NoError
	}
	switch {
	case errors.Is(e.Err, throttle.ErrUnavailable):
		return BackendError
	case errors.Is(e.Err, throttle.ErrInvalid), errors.Is(e.Err, throttle.ErrExceedsLimit):
		return ClientError
	}
	return OtherError
}

// Cache maps limiter names to values built once by a func. Get is safe
// for concurrent use; for a name already seen it takes no lock and does
// not allocate. Names are few (one per limiter), so the map is copied on
// each new name.
type Cache[T any] struct {
	m     atomic.Pointer[map[string]T]
	mu    sync.Mutex // serializes builders
	build func(name string) T
}

// NewCache returns a Cache whose values are made by build.
func NewCache[T any](build func(name string) T) *Cache[T] {
	c := &Cache[T]{build: build}
	c.m.Store(&map[string]T{})
	return c
}

// Get returns the value of name, building it on first use.
func (c *Cache[T]) Get(name string) T {
	if v, ok := (*c.m.Load())[name]; ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	if v, ok := old[name]; ok {
		return v
	}
	v := c.build(name)
	next := make(map[string]T, len(old)+1)
	for k, x := range old {
		next[k] = x
	}
	next[name] = v
	c.m.Store(&next)
	return v
}
