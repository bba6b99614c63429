package redislimit

import (
	"sync/atomic"
	"time"
)

// epoch is the origin of the breaker's monotonic clock.
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) }

// breaker is a lock-free circuit breaker. Closed, every call goes to
// Redis; after threshold consecutive failures it opens until openUntil
// and calls fail without touching the network; then exactly one call at a
// time probes Redis, and its success closes the breaker. It runs on real
// time, never on an injected clock: timeouts are real.
type breaker struct {
	threshold int32
	cooldown  int64
	fails     atomic.Int32
	openUntil atomic.Int64 // 0 when closed
	probing   atomic.Bool
}

func (b *breaker) init(failures int, cooldown time.Duration) {
	b.threshold, b.cooldown = int32(min(failures, 1<<30)), int64(cooldown)
}

// allow reports whether a call may go to Redis now.
func (b *breaker) allow() bool {
	u := b.openUntil.Load()
	if u == 0 {
		return true
	}
	if mono() < u {
		return false
	}
	return b.probing.CompareAndSwap(false, true)
}

// success records a call that Redis answered.
// It reports whether the call closed the breaker.
func (b *breaker) success() (closed bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.openUntil.Load() != 0 && b.openUntil.Swap(0) != 0 {
		b.probing.Store(false)
		return true
	}
	return false
}

// failure records a call that Redis did not answer in time.
// It reports whether the call opened a closed breaker.
func (b *breaker) failure() (opened bool) {
	if b.threshold == 0 {
		return false
	}
	if b.fails.Add(1) >= b.threshold || b.probing.Load() {
		opened = b.openUntil.Swap(mono()+b.cooldown) == 0
		b.probing.Store(false)
	}
	return opened
}

// release ends a probe that neither succeeded nor failed (the caller
// cancelled it).
func (b *breaker) release() {
	if b.probing.Load() {
		b.probing.Store(false)
	}
}

// retryAfter is the hint returned with a failed call: the rest of the
// cooldown while open, else nothing.
func (b *breaker) retryAfter() time.Duration {
	if u := b.openUntil.Load(); u != 0 {
		return time.Duration(max(u-mono(), 0))
	}
	return 0
}
