// Package counting limits concurrency: how many units (requests,
// connections, bytes of buffer) are in flight at once, per key or for a
// single resource. Capacity comes back by release, not by time: these are
// counting semaphores, or "gauge" resources in Doorman's terms.
//
//	sem, err := counting.NewSemaphore(8) // at most 8 jobs at once
//	release, err := sem.Hold(ctx, "", 1) // waits its turn, FIFO
//	if err != nil {
//		return err
//	}
//	defer release()
//
// # Guarantee
//
// At every instant the units held for a key sum to at most its limit
// (exactly: no more and, for a non-blocking acquire with nobody queued,
// no fewer). Blocking acquirers are served in FIFO order with the
// semantics of golang.org/x/sync/semaphore: once one is queued, no later
// request overtakes it, even a smaller one that would fit, so large
// weighted requests are never starved. A release of more than is held is
// an error (wrapping throttle.ErrInvalid), never a negative count.
//
// The limit can be changed at runtime with SetLimit: waiters that now fit
// are woken at once; waiters for more units than the new limit fail with
// an error wrapping throttle.ErrExceedsLimit; units already held above a
// lowered limit stay held, and nothing more is granted until they drop
// below it. A request racing with SetLimit may be judged against either
// limit.
//
// # Cost and memory
//
// A non-blocking take (Allow, TryHold) and release with nobody queued
// are one compare-and-swap each, lock-free, with no allocation. Hold
// takes the same path when the units are free, and allocates only its
// idempotent release function (two small objects); when it must queue it
// takes a mutex and allocates a waiter.
//
// The keyed Limiter holds state (32 bytes on 64-bit platforms, plus the
// map's entry) only for keys with units in flight or waiters: a key back
// to zero is dropped lazily as new keys arrive, or by Sweep or the sweeper
// of throttle.WithSweepInterval. The MaxKeys cap never drops a key that
// holds units (that would lose them): past it, idle keys are dropped
// first, and the cap is exceeded rather than forget held units.
package counting

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

var errClosed = fmt.Errorf("%w: counting", throttle.ErrClosed)

// Semaphore is a counting semaphore guarding a single resource. It is safe
// for concurrent use by multiple goroutines. The zero value is not usable;
// create one with NewSemaphore.
type Semaphore struct {
	limit atomic.Int64
	s     sem
}

// NewSemaphore returns a Semaphore admitting at most limit units in
// flight. Errors wrap throttle.ErrInvalid (limit <= 0 or above MaxLimit).
func NewSemaphore(limit int) (*Semaphore, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	s := new(Semaphore)
	s.limit.Store(int64(limit))
	return s, nil
}

// Hold takes n units, waiting until they are free and every earlier
// waiter has been served; the key is ignored. On success it returns a
// release function that gives the units back; calling it more than once
// does nothing, so it can be deferred and also called early. On failure
// nothing is held and the error wraps ctx.Err() (returned even if the
// units were free, when ctx is already done), throttle.ErrInvalid (n <= 0)
// or throttle.ErrExceedsLimit (n above the limit, or above a limit lowered
// while waiting).
func (s *Semaphore) Hold(ctx context.Context, _ string, n int) (release func(), err error) {
	if err := limiterkit.CheckN(n, int(s.limit.Load())); err != nil {
		return nil, err
	}
	if err := s.s.acquire(ctx, uint64(n), &s.limit, nil); err != nil {
		return nil, err
	}
	return releaser(&s.s, uint64(n), &s.limit), nil
}

// Release gives back n units taken with Allow or AllowN, and
// wakes the waiters that now fit. Releasing more than is held returns an
// error wrapping throttle.ErrInvalid and releases nothing.
func (s *Semaphore) Release(n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: counting: release of %d units", throttle.ErrInvalid, n)
	}
	return s.s.release(uint64(n), &s.limit)
}

// Allow is AllowN(n); the key is ignored and ctx is not waited on.
func (s *Semaphore) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = s.allow(&d, n)
	return d, err
}

// AllowN takes n units if they are free and nobody is waiting in Hold,
// without blocking: Allowed says whether it did (give them back with
// Release, or take them with TryHold, whose release func does), Remaining
// how many are free for a non-blocking take. RetryAfter and ResetAfter are 0:
// capacity comes back by release, not by time. Errors wrap
// throttle.ErrInvalid (n <= 0) or throttle.ErrExceedsLimit (n > limit).
func (s *Semaphore) AllowN(n int) (d throttle.Decision, err error) {
	err = s.allow(&d, n)
	return d, err
}

// allow is AllowN filling d (see limiterkit.Fill).
func (s *Semaphore) allow(d *throttle.Decision, n int) error {
	lim := s.limit.Load()
	if err := limiterkit.CheckN(n, int(lim)); err != nil {
		return err
	}
	ok, cur, _ := s.s.tryAcquire(uint64(n), uint64(lim))
	free := max(lim-int64(cur), 0)
	if !ok {
		free = int64(remaining(s.s.word.Load(), uint64(lim)))
	}
	limiterkit.Fill(d, ok, lim, free, 0, 0)
	return nil
}

// SetLimit changes the limit. Waiters that fit under a raised limit are
// woken; waiters for more than a lowered limit fail with an error wrapping
// throttle.ErrExceedsLimit. Units held are not taken back. Errors wrap
// throttle.ErrInvalid (limit <= 0 or above MaxLimit).
func (s *Semaphore) SetLimit(limit int) error {
	if err := checkLimit(limit); err != nil {
		return err
	}
	s.limit.Store(int64(limit))
	s.s.wake(uint64(limit), nil)
	return nil
}

// Limit returns the current limit.
func (s *Semaphore) Limit() int { return int(s.limit.Load()) }

// InFlight returns the units currently held.
func (s *Semaphore) InFlight() int { return int(s.s.word.Load() & curMask) }

// releaser returns an idempotent function releasing n units of s.
func releaser(s *sem, n uint64, limit *atomic.Int64) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			_ = s.release(n, limit) // cannot fail: these n units are held
		}
	}
}

// Limiter is a counting semaphore per key: at most limit units in flight
// for each key. It is safe for concurrent use by multiple goroutines. The
// zero value is not usable; create one with New.
type Limiter struct {
	limit atomic.Int64
	m     *keyed.Map[box, *box]
}

// state is the semaphore of one key. The zero value has nothing in flight.
type state struct{ sem }

// box holds a key's state in the map: waiters hold it, so it does not move.
type box = keyed.Box[state, *state]

// Retire marks the state dead if nothing is held or queued. It refuses
// even when forced: dropping a key with units in flight would forget
// them and let the key exceed its limit.
func (s *state) Retire(_ keyed.Judge, _ bool) bool {
	for {
		w := s.word.Load()
		switch {
		case w&dead != 0:
			return true
		case w != 0:
			return false
		case s.word.CompareAndSwap(0, dead):
			return true
		}
	}
}

// New returns a Limiter admitting at most limit units in flight per key.
// Options bound the keys (throttle.WithMaxKeys, WithMaxKeyLen,
// WithSweepInterval); the clock is not used. Errors wrap
// throttle.ErrInvalid.
func New(limit int, opts ...throttle.Option) (*Limiter, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	l := &Limiter{m: keyed.New[box](s)}
	l.limit.Store(int64(limit))
	return l, nil
}

func (l *Limiter) check(key string, n int) (lim int64, err error) {
	if err := l.m.Check(key); err != nil {
		return 0, err
	}
	lim = l.limit.Load()
	return lim, limiterkit.CheckN(n, int(lim))
}

// Allow takes n units for key if they are free and nobody is waiting for
// key in Hold, without blocking: Allowed says whether it did, Remaining
// how many units are free for key. The units stay held until Release:
// code that sees the limiter only as a throttle.Limiter cannot give them
// back, so generic code should use TryHold (throttle.TryHold, Wrap and the
// HTTP middleware do). RetryAfter and ResetAfter are 0: capacity comes
// back by release, not by time. Errors wrap throttle.ErrInvalid (n <= 0,
// empty or oversized key), throttle.ErrExceedsLimit (n > limit) or
// throttle.ErrClosed.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	_, err = l.try(&d, key, n)
	return d, err
}

// Hold takes n units for key, waiting until they are free and every
// earlier waiter for key has been served. On success it returns a release
// function that gives the units back; calling it more than once does
// nothing, so it can be deferred and also called early. On failure nothing
// is held and the error wraps ctx.Err() (returned even if the units were
// free, when ctx is already done), throttle.ErrInvalid (n <= 0, bad key),
// throttle.ErrExceedsLimit (n above the limit, or above a limit lowered
// while waiting) or throttle.ErrClosed (also when Close ends the wait).
func (l *Limiter) Hold(ctx context.Context, key string, n int) (release func(), err error) {
	if _, err := l.check(key, n); err != nil {
		return nil, err
	}
	for {
		b, _ := l.m.Get(key, 0) // counting states ignore time
		s := b.State()
		switch err := s.acquire(ctx, uint64(n), &l.limit, l.closedErr); err {
		case nil:
			return releaser(&s.sem, uint64(n), &l.limit), nil
		case errRetry:
		default:
			return nil, err
		}
	}
}

func (l *Limiter) closedErr() error {
	if l.m.Closed() {
		return errClosed
	}
	return nil
}

// Release gives back n units held for key (taken with Allow)
// and wakes the waiters for key that now fit. Releasing more than is held
// returns an error wrapping throttle.ErrInvalid and releases nothing.
// Release works after Close, so holders can finish.
func (l *Limiter) Release(key string, n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: counting: release of %d units", throttle.ErrInvalid, n)
	}
	b := l.m.Load(key)
	if b == nil {
		return fmt.Errorf("%w: counting: release of %d units, 0 held", throttle.ErrInvalid, n)
	}
	return b.State().release(uint64(n), &l.limit)
}

// SetLimit changes the limit of every key. Waiters that fit under a
// raised limit are woken; waiters for more than a lowered limit fail with
// an error wrapping throttle.ErrExceedsLimit. Units held are not taken
// back. Errors wrap throttle.ErrInvalid (limit <= 0 or above MaxLimit).
func (l *Limiter) SetLimit(limit int) error {
	if err := checkLimit(limit); err != nil {
		return err
	}
	l.limit.Store(int64(limit))
	l.m.Range(func(b *box) bool {
		b.State().wake(uint64(limit), nil)
		return true
	})
	return nil
}

// Limit returns the current limit per key.
func (l *Limiter) Limit() int { return int(l.limit.Load()) }

// InFlight returns the units currently held for key.
func (l *Limiter) InFlight(key string) int {
	if b := l.m.Load(key); b != nil {
		return int(b.State().word.Load() & curMask)
	}
	return 0
}

// Len returns the number of keys holding state: keys with units in flight
// or waiters, and idle keys not yet dropped.
func (l *Limiter) Len() int { return l.m.Len() }

// Sweep drops the state of every key with nothing in flight and nobody
// waiting, and returns how many keys it dropped. Calling it is optional:
// idle keys are also dropped as new keys arrive.
func (l *Limiter) Sweep() int { return l.m.Sweep() }

// Close stops the sweeper, if any, and fails every waiting Hold with an
// error wrapping throttle.ErrClosed. Allow, TryHold and Hold then fail the
// same way; Release still works. Close is idempotent and returns nil.
func (l *Limiter) Close() error {
	err := l.m.Close()
	l.m.Range(func(b *box) bool {
		b.State().wake(uint64(l.limit.Load()), errClosed)
		return true
	})
	return err
}
