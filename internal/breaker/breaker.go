// Package breaker is the circuit breaker of package failsafe and of the
// backends of this module (Redis, the daemon client): lock-free, on
// whatever clock the caller reads.
package breaker

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// Breaker is a circuit breaker: after Failures consecutive failed calls it
// opens for a cooldown, during which calls are refused at once, then lets
// one call through (the probe). A probe that succeeds closes the breaker;
// one that fails opens it again for twice the last cooldown, up to
// MaxCooldown. Only failed probes lengthen the cooldown: the other calls
// in flight when the store failed open it once, for the base cooldown. Every method is lock-free and safe for concurrent use.
// Instants are nanoseconds of whatever clock the caller reads (the same
// one on every call). The zero Breaker never opens.
type Breaker struct {
	failures int32
	cooldown int64
	max      int64

	fails     atomic.Int32 // consecutive failures
	streak    atomic.Int32 // consecutive failed probes
	openUntil atomic.Int64 // 0 while closed
	probing   atomic.Bool
}

// NewBreaker returns a breaker opening after failures consecutive failures
// (0: never) for cooldown, doubled after each failed probe up to
// maxCooldown (maxCooldown <= cooldown: always cooldown). Errors wrap
// throttle.ErrInvalid.
func NewBreaker(failures int, cooldown, maxCooldown time.Duration) (*Breaker, error) {
	b := new(Breaker)
	if err := b.Init(failures, cooldown, maxCooldown); err != nil {
		return nil, err
	}
	return b, nil
}

// Init is NewBreaker for a Breaker embedded in another value. It must be
// called before the breaker is used.
func (b *Breaker) Init(failures int, cooldown, maxCooldown time.Duration) error {
	if failures < 0 || failures > 0 && cooldown <= 0 {
		return fmt.Errorf("%w: breaker of %d failures and cooldown %v: want failures >= 0 and, with failures, a positive cooldown", throttle.ErrInvalid, failures, cooldown)
	}
	b.failures = int32(min(failures, 1<<30))
	b.cooldown, b.max = int64(cooldown), int64(max(cooldown, maxCooldown))
	return nil
}

// Allow reports whether a call may go to the backend at now, and whether
// it is the probe of an open breaker. The caller then reports the call's
// outcome with Success, Failure or Release, passing probe on.
func (b *Breaker) Allow(now int64) (probe, ok bool) {
	u := b.openUntil.Load()
	switch {
	case u == 0:
		return false, true
	case now < u:
		return false, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true // this caller probes; the others wait for it
	}
	return false, false
}

// Success records a call the backend answered, and reports whether it
// closed the breaker. Only the probe's success closes an open breaker: a
// call begun before it opened (a slow one) says nothing of the store now.
func (b *Breaker) Success(probe bool) (closed bool) {
	if !probe {
		if b.openUntil.Load() == 0 && b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return false
	}
	b.fails.Store(0)
	b.streak.Store(0)
	closed = b.openUntil.Swap(0) != 0
	b.probing.Store(false)
	return closed
}

// Failure records a call the backend failed at now, and reports whether it
// opened a closed breaker.
func (b *Breaker) Failure(now int64, probe bool) (opened bool) {
	if b.failures == 0 {
		return false
	}
	if probe {
		k := min(b.streak.Add(1), 62)
		pause := b.cooldown
		for i := int32(0); i < k && pause < b.max; i++ {
			pause *= 2
		}
		b.openUntil.Store(now + min(pause, b.max))
		b.probing.Store(false)
		return false
	}
	// The first failure past the count opens a closed breaker; the rest of
	// the outage's calls find it open and change nothing.
	return b.fails.Add(1) >= b.failures && b.openUntil.Load() == 0 && b.openUntil.CompareAndSwap(0, now+b.cooldown)
}

// Release ends a call that learned nothing of the backend (its caller gave
// up): a probe lets the next caller probe.
func (b *Breaker) Release(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}

// RetryAfter returns how long the breaker stays open after now (0 when
// closed or due for a probe).
func (b *Breaker) RetryAfter(now int64) time.Duration {
	if u := b.openUntil.Load(); u > now {
		return time.Duration(u - now)
	}
	return 0
}

// Open reports whether the breaker is open (refusing calls, or waiting
// for its probe).
func (b *Breaker) Open() bool { return b.openUntil.Load() != 0 }
