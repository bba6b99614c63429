// Package reporttest checks that a limiter taking an observer reports
// every call it makes: one table of cases for every such limiter of the
// module, run by each module that has some (the root module, the Redis
// backend).
package reporttest

import (
	"slices"
	"sync"
	"testing"

	"github.com/throttlekit/throttle"
)

// Case is a limiter, or a wrapper, that takes an observer.
type Case struct {
	Name string
	// New returns call, which makes the i-th call (i from 0) of a limiter
	// reporting to o under name. call returns the call's error, if any.
	New func(t *testing.T, name string, o throttle.Observer) (call func(i int) error)
	// Calls is how many calls to make.
	Calls int
	// Fallbacks is how many of them a failure policy decided, and Refused
	// how many of those it refused (a FailClosed refusal is a fallback).
	Fallbacks, Refused int
	// Releases is how many EventRelease the calls are followed by (units
	// held by TryHold or Hold, then given back).
	Releases int
	// Breaker, when set, is true when the breaker must have opened.
	Breaker bool
}

// Run makes the calls of every case and checks what its observer saw:
// one EventDecision or EventError per call (an EventError exactly for a
// call that returned an error), the fallbacks, refusals and releases the
// case states, and every Event under the case's name.
func Run(t *testing.T, cases []Case) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var o Counter
			call := c.New(t, "obs-"+c.Name, &o)
			failed := 0
			for i := range c.Calls {
				if call(i) != nil {
					failed++
				}
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			if got := o.kinds[throttle.EventDecision] + o.kinds[throttle.EventError]; got != c.Calls {
				t.Errorf("%d calls reported (%d decisions, %d errors), want %d", got, o.kinds[throttle.EventDecision], o.kinds[throttle.EventError], c.Calls)
			}
			if got := o.kinds[throttle.EventError]; got != failed {
				t.Errorf("%d EventError, want %d: one per call that returned an error", got, failed)
			}
			if got := o.kinds[throttle.EventFallback]; got != c.Fallbacks {
				t.Errorf("%d EventFallback, want %d", got, c.Fallbacks)
			}
			if o.refused != c.Refused {
				t.Errorf("%d fallbacks refused, want %d", o.refused, c.Refused)
			}
			if got := o.kinds[throttle.EventRelease]; got != c.Releases {
				t.Errorf("%d EventRelease, want %d", got, c.Releases)
			}
			if got := o.kinds[throttle.EventBreakerOpen] > 0; got != c.Breaker {
				t.Errorf("breaker opened: %v, want %v", got, c.Breaker)
			}
			for _, name := range o.names {
				if name != "obs-"+c.Name {
					t.Errorf("an Event under %q, want %q", name, "obs-"+c.Name)
				}
			}
		})
	}
}

// BenchObserve measures o.Observe(e) from parallel goroutines, with
// allocations, after a first call has let o resolve what it keeps for e.
func BenchObserve(b *testing.B, o throttle.Observer, e throttle.Event) {
	o.Observe(e)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o.Observe(e)
		}
	})
}

// Recorder is an Observer that keeps every Event in order. Its zero
// value is ready; its methods are safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []throttle.Event
}

// Observe keeps e.
func (r *Recorder) Observe(e throttle.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns the Events kept so far.
func (r *Recorder) Events() []throttle.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Count returns how many Events of kind k were kept under name.
func (r *Recorder) Count(k throttle.EventKind, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == k && e.Limiter == name {
			n++
		}
	}
	return n
}

// Counter is an Observer counting Events by kind.
type Counter struct {
	mu      sync.Mutex
	kinds   map[throttle.EventKind]int
	refused int      // fallbacks not allowed
	names   []string // the names of Events, each once
}

// Observe counts e.
func (c *Counter) Observe(e throttle.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kinds == nil {
		c.kinds = map[throttle.EventKind]int{}
	}
	c.kinds[e.Kind]++
	if e.Kind == throttle.EventFallback && !e.Decision.Allowed {
		c.refused++
	}
	for _, n := range c.names {
		if n == e.Limiter {
			return
		}
	}
	c.names = append(c.names, e.Limiter)
}
