package storelimit

import (
	"context"
	"sync"

	"github.com/throttlekit/throttle"
)

var _ throttle.LoadingStore = (*Memory)(nil)

// Memory is a throttle.Store in the process's memory: the reference
// implementation of the contract, for tests and for a single process
// that wants a Store-backed limiter. A state is dropped when a
// compare-and-swap or a Sweep finds it expired. It is safe for concurrent
// use; the zero value is an empty store.
type Memory struct {
	mu sync.Mutex
	m  map[string]entry
}

type entry struct{ state, expires int64 }

// Load returns key's state at now, 0 when it has none live.
func (s *Memory) Load(_ context.Context, key string, now int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok || e.expires < now {
		return 0, nil
	}
	return e.state, nil
}

// CompareAndSwap sets key's state to next, live until expires, if its
// state at now is old.
func (s *Memory) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	_, ok, err := s.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	return ok, err
}

// CompareAndSwapLoad is CompareAndSwap that returns key's state at now
// when it does not swap.
func (s *Memory) CompareAndSwapLoad(_ context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if ok && e.expires < now {
		e = entry{}
	}
	if e.state != old {
		return e.state, false, nil
	}
	if next == 0 || expires < now {
		delete(s.m, key)
		return 0, true, nil
	}
	if s.m == nil {
		s.m = make(map[string]entry)
	}
	s.m[key] = entry{next, expires}
	return 0, true, nil
}

// Sweep drops the states expired before now and returns how many it dropped.
func (s *Memory) Sweep(now int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, e := range s.m {
		if e.expires < now {
			delete(s.m, k)
			n++
		}
	}
	return n
}

// size returns the number of keys stored, live or not yet swept.
func (s *Memory) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
