// Package throttletest helps test rate limiters: a virtual Clock to inject
// with throttle.WithClock, and Run, the conformance suite that every
// Limiter in this module passes. Use it on your own implementations too.
package throttletest

import (
	"sync/atomic"
	"time"
)

// Clock is a virtual clock that moves only when told. It is safe for
// concurrent use. The zero value reads the Unix epoch; NewClock starts it
// at a fixed date.
type Clock struct{ ns atomic.Int64 }

// Epoch is where NewClock starts: a fixed instant, so traces are
// reproducible.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewClock returns a Clock reading Epoch.
func NewClock() *Clock {
	c := new(Clock)
	c.Set(Epoch)
	return c
}

// Now returns the virtual time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Advance moves the clock forward by d (backward if d is negative).
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }
