package throttletest

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/limiterkit"
)

// Decide is an algorithm's decision as a pure function of a key's state, as
// tokenbucket.Algorithm.Decide has it.
type Decide func(state, now int64, n int) (next int64, d throttle.Decision, err error)

// Store is a keyed limiter that keeps each key's state in a map and
// decides with step, reading clk once per decision: what a store of one's
// own (a SQL row, a Memcached item) does with an Algorithm, for tests to
// run the conformance suite and differential traces on. fresh is the
// state of a key never seen.
func Store(clk *Clock, fresh int64, step Decide) throttle.Limiter {
	return &store{clk: clk, fresh: fresh, step: step, m: map[string]int64{}}
}

// keyCheck holds the default key bounds.
var keyCheck, _ = limiterkit.NewSettings()

type store struct {
	clk   *Clock
	fresh int64
	step  Decide
	mu    sync.Mutex // one transaction at a time, as a compare-and-swap retried
	m     map[string]int64
}

func (s *store) Allow(_ context.Context, key string, n int) (throttle.Decision, error) {
	if err := keyCheck.CheckKey(key); err != nil {
		return throttle.Decision{}, err
	}
	now := s.clk.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	state, ok := s.m[key]
	if !ok {
		state = s.fresh
	}
	next, d, err := s.step(state, now, n)
	if err == nil && d.Allowed {
		s.m[key] = next
	}
	return d, err
}

// Differential drives want and got with the same random trace of steps
// steps on clk (gaps up to a second, 1 to limit units, keys a, b and c)
// and fails t at the first decision or error that differs.
func Differential(t testing.TB, clk *Clock, want, got throttle.Limiter, limit, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(limit), uint64(steps)))
	keys := []string{"a", "b", "c"}
	for i := range steps {
		if rng.IntN(3) != 0 {
			clk.Advance(time.Duration(rng.Int64N(int64(time.Second))))
		}
		key, n := keys[rng.IntN(len(keys))], 1+rng.IntN(limit)
		w, werr := want.Allow(context.Background(), key, n)
		g, gerr := got.Allow(context.Background(), key, n)
		if w != g || (werr == nil) != (gerr == nil) {
			t.Fatalf("step %d at %v, %s n=%d:\n want %+v, %v\n got  %+v, %v", i, clk.Now(), key, n, w, werr, g, gerr)
		}
	}
}
