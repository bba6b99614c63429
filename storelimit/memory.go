package storelimit

import (
	"context"
	"sync"
)

var _ BatchStore = (*Memory)(nil)

// Memory is a Store (a BatchStore) in the process's memory: the reference
// implementation of the contract, for tests and for a single process
// that wants a Store-backed limiter. A state is dropped when a
// compare-and-swap or a Sweep finds it expired. It is safe for concurrent
// use; the zero value is an empty store. A type that embeds Memory to
// override CompareAndSwapLoad (to inject faults) also gets
// CompareAndSwapBatch, which a Limiter uses instead once 16 of its calls
// are at the store: override both.
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
	state, ok := s.swap(key, old, next, now, expires)
	return state, ok, nil
}

// CompareAndSwapBatch does each swap of swaps as CompareAndSwapLoad
// would, all under one hold of the store's lock.
func (s *Memory) CompareAndSwapBatch(_ context.Context, swaps []Swap) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range swaps {
		w := &swaps[i]
		w.State, w.Swapped = s.swap(w.Key, w.Old, w.Next, w.Now, w.Expires)
	}
	return nil
}

// swap is CompareAndSwapLoad, under s.mu.
func (s *Memory) swap(key string, old, next, now, expires int64) (int64, bool) {
	e, ok := s.m[key]
	if ok && e.expires < now {
		e = entry{}
	}
	if e.state != old {
		return e.state, false
	}
	if next == 0 || expires < now {
		delete(s.m, key)
		return 0, true
	}
	if s.m == nil {
		s.m = make(map[string]entry)
	}
	s.m[key] = entry{next, expires}
	return 0, true
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
