package counting

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttle"
)

// MaxLimit is the largest limit a Semaphore or Limiter accepts: units in
// flight share a 64-bit word with two flags.
const MaxLimit = 1<<62 - 1

// Layout of sem.word.
const (
	curMask = 1<<62 - 1 // units in flight
	queued  = 1 << 62   // waiters are queued: only mu holders change the word
	dead    = 1 << 63   // retired from a keyed map (keyed states only)
)

// sem is a counting semaphore whose limit is kept by its owner and passed
// to every call. The zero value has nothing in flight.
//
// The uncontended paths (tryAcquire, release with no waiters) are one
// compare-and-swap on word. Blocking acquirers queue in FIFO order under
// mu; while any is queued, the queued flag sends every other call to the
// slow path, so a large request at the head of the queue is never
// overtaken by smaller ones (no starvation), and only mu holders change
// word.
type sem struct {
	word atomic.Uint64
	mu   sync.Mutex
	head *waiter // oldest waiter; head != nil if and only if word&queued != 0
	tail *waiter
}

type waiter struct {
	n          uint64
	ready      chan struct{} // closed once err is set
	err        error         // nil: n units were granted
	prev, next *waiter
}

// tryAcquire takes n units if they fit under limit and nobody is queued.
// It returns the units in flight after the call and whether the state is
// dead (retired; nothing was taken).
func (s *sem) tryAcquire(n, limit uint64) (ok bool, cur uint64, isDead bool) {
	for {
		w := s.word.Load()
		cur = w & curMask
		switch {
		case w&dead != 0:
			return false, 0, true
		case w&queued != 0 || cur+n > limit:
			return false, cur, false
		}
		if s.word.CompareAndSwap(w, w+n) {
			return true, cur + n, false
		}
	}
}

// release gives back n units and wakes the waiters that now fit.
func (s *sem) release(n uint64, limit *atomic.Int64) error {
	for {
		w := s.word.Load()
		if n > w&curMask {
			return fmt.Errorf("%w: counting: release of %d units, %d held", throttle.ErrInvalid, n, w&curMask)
		}
		if w&queued != 0 {
			break
		}
		if s.word.CompareAndSwap(w, w-n) {
			return nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(n, uint64(limit.Load()))
}

// releaseLocked is release with s.mu held.
func (s *sem) releaseLocked(n, limit uint64) error {
	for {
		w := s.word.Load()
		if n > w&curMask {
			return fmt.Errorf("%w: counting: release of %d units, %d held", throttle.ErrInvalid, n, w&curMask)
		}
		if s.word.CompareAndSwap(w, w-n) {
			break
		}
	}
	s.grant(limit)
	return nil
}

// errRetry reports that the state was retired: look the key up again.
var errRetry = fmt.Errorf("counting: state retired")

// acquire takes n units, waiting in FIFO order until they fit, ctx is done
// (its error is returned and nothing is held), or the waiter is failed (n
// above a lowered limit, or the limiter closed: closed, if not nil,
// returns the error to fail with). It returns errRetry if the state is
// dead.
func (s *sem) acquire(ctx context.Context, n uint64, limit *atomic.Int64, closed func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch ok, _, isDead := s.tryAcquire(n, uint64(limit.Load())); {
	case ok:
		return nil
	case isDead:
		return errRetry
	}
	s.mu.Lock()
	wt, err := s.queue(n, limit, closed)
	s.mu.Unlock()
	if wt == nil {
		return err
	}
	select {
	case <-wt.ready:
		return wt.err
	case <-ctx.Done():
	}
	s.leave(wt, n, limit)
	return ctx.Err()
}

// queue takes n units at once if nobody waits and they fit, else queues
// a waiter for them and returns it. Without a waiter, err is nil when the
// units were taken. s.mu is held.
func (s *sem) queue(n uint64, limit *atomic.Int64, closed func() error) (wt *waiter, err error) {
	// The limit may have been lowered since the caller checked n.
	if lim := uint64(limit.Load()); n > lim {
		return nil, exceeds(n, lim)
	}
	for {
		w := s.word.Load()
		if w&dead != 0 {
			return nil, errRetry
		}
		if w&queued != 0 {
			break
		}
		if w&curMask+n <= uint64(limit.Load()) {
			if s.word.CompareAndSwap(w, w+n) {
				return nil, nil
			}
		} else if s.word.CompareAndSwap(w, w|queued) {
			break
		}
	}
	wt = &waiter{n: n, ready: make(chan struct{}), prev: s.tail}
	if s.tail != nil {
		s.tail.next = wt
	} else {
		s.head = wt
	}
	s.tail = wt
	// SetLimit and Close store their change before they look for queued
	// waiters, which this waiter may have joined too late to be seen: so
	// look at the limit and at closed again now that it is queued.
	if closed != nil {
		err = closed()
	}
	s.fail(uint64(limit.Load()), err)
	return wt, nil
}

// leave takes wt, whose context ended, out of the queue; if it was
// granted (or failed) meanwhile, its n units are given back, as if the
// grant had come a moment later.
func (s *sem) leave(wt *waiter, n uint64, limit *atomic.Int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-wt.ready:
		if wt.err == nil {
			_ = s.releaseLocked(n, uint64(limit.Load()))
		}
	default:
		front := s.head == wt
		s.unlink(wt)
		if front {
			s.grant(uint64(limit.Load())) // those behind may fit now
		}
	}
}

// unlink removes wt from the queue, clearing the queued flag when the
// queue empties. s.mu is held.
func (s *sem) unlink(wt *waiter) {
	if wt.prev != nil {
		wt.prev.next = wt.next
	} else {
		s.head = wt.next
	}
	if wt.next != nil {
		wt.next.prev = wt.prev
	} else {
		s.tail = wt.prev
	}
	wt.prev, wt.next = nil, nil
	if s.head == nil {
		s.word.And(^uint64(queued))
	}
}

// grant hands units to the waiters at the head of the queue while they
// fit under limit, in order: one that does not fit blocks those behind it.
// s.mu is held.
func (s *sem) grant(limit uint64) {
	for wt := s.head; wt != nil; wt = s.head {
		// The queued flag is set, so only s.mu holders change word.
		if s.word.Load()&curMask+wt.n > limit {
			return
		}
		s.word.Add(wt.n)
		s.unlink(wt)
		close(wt.ready)
	}
}

// fail fails the queued waiters for more than limit units, which can no
// longer be granted, or every waiter if err is not nil, then grants what
// fits. s.mu is held.
func (s *sem) fail(limit uint64, err error) {
	for wt := s.head; wt != nil; {
		next := wt.next
		if err != nil || wt.n > limit {
			s.unlink(wt)
			wt.err = err
			if wt.err == nil {
				wt.err = exceeds(wt.n, limit)
			}
			close(wt.ready)
		}
		wt = next
	}
	s.grant(limit)
}

// wake applies a change already stored (a new limit, or closed when err
// is not nil) to the queue: it fails the waiters that can no longer be
// granted and grants those that fit now.
func (s *sem) wake(limit uint64, err error) {
	if s.word.Load()&queued == 0 {
		return // a waiter queued from now on sees the change itself
	}
	s.mu.Lock()
	s.fail(limit, err)
	s.mu.Unlock()
}

func exceeds(n, limit uint64) error {
	return fmt.Errorf("%w: n=%d is above the limit %d", throttle.ErrExceedsLimit, n, limit)
}

// remaining is how many units a non-blocking acquire could take right
// now, given the word and the limit.
func remaining(w, limit uint64) int {
	if w&queued != 0 || w&curMask >= limit {
		return 0
	}
	return int(limit - w&curMask)
}

// checkLimit validates a limit for NewSemaphore, New and SetLimit.
func checkLimit(limit int) error {
	if limit <= 0 || uint64(limit) > MaxLimit {
		return fmt.Errorf("%w: counting: limit must be in [1, %d], got %d", throttle.ErrInvalid, uint64(MaxLimit), limit)
	}
	return nil
}
