package faultsim

import (
	"sync"
	"time"
)

// Clock is one process's clock: virtual time plus its steps and skew. It
// implements throttle.Clock. It is safe for concurrent use; the zero
// value is not usable (Run makes one per process).
type Clock struct {
	mu     sync.Mutex
	anchor time.Time // the virtual time of the last change
	at     time.Time // what the clock read then
	rate   float64   // the clock's rate against virtual time
	steps  time.Duration
}

// NewClock returns a clock reading the current (virtual) time, at rate 1.
func NewClock() *Clock {
	now := time.Now()
	return &Clock{anchor: now, at: now, rate: 1}
}

// Now returns the process's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nowLocked(time.Now())
}

func (c *Clock) nowLocked(real time.Time) time.Time {
	return c.at.Add(time.Duration(float64(real.Sub(c.anchor)) * c.rate))
}

// Step moves the clock by d (back when d < 0).
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	real := time.Now()
	c.at, c.anchor = c.nowLocked(real).Add(d), real
	c.steps += d
}

// Monotonic returns the clock without its steps, skewed alike: what a
// process's monotonic clock reads, which steps of the wall clock do not
// move. It implements throttle.Clock.
func (c *Clock) Monotonic() Monotonic { return Monotonic{c} }

// Monotonic is a Clock read without its steps.
type Monotonic struct{ c *Clock }

// Now returns the clock's time less its steps.
func (m Monotonic) Now() time.Time {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.nowLocked(time.Now()).Add(-m.c.steps)
}

// SetSkew makes the clock run at rate 1+p from now on.
func (c *Clock) SetSkew(p float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	real := time.Now()
	c.at, c.anchor, c.rate = c.nowLocked(real), real, 1+p
}

// Offset returns how far the clock is ahead of virtual time (behind when
// negative).
func (c *Clock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	real := time.Now()
	return c.nowLocked(real).Sub(real)
}
