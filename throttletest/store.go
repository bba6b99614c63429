package throttletest

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/storelimit"
)

// Decide is an algorithm's decision as a pure function of a key's state, as
// tokenbucket.Algorithm.Decide has it.
type Decide func(state, now int64, n int) (next int64, d throttle.Decision, err error)

// Store is a keyed limiter that keeps each key's state in memory and
// decides with step, reading clk once per decision; fresh is the state of
// a key never seen.
//
// Deprecated: an Algorithm over a store is storelimit's job:
// storelimit.New(new(storelimit.Memory), alg, throttle.WithClock(clk)),
// and storetest runs the suite and the differential traces on any store.
func Store(clk *Clock, fresh int64, step Decide) throttle.Limiter {
	l, err := storelimit.New(new(storelimit.Memory), stepAlgorithm{fresh, step}, throttle.WithClock(clk))
	if err != nil {
		panic(err) // unreachable: the options and the algorithm are valid
	}
	return l
}

// stepAlgorithm is a Decide func as a throttle.Algorithm whose Decide
// checks n itself.
type stepAlgorithm struct {
	fresh int64
	step  Decide
}

func (a stepAlgorithm) Decide(state, now int64, n int) (int64, throttle.Decision, error) {
	return a.step(state, now, n)
}
func (a stepAlgorithm) Fresh() int64          { return a.fresh }
func (a stepAlgorithm) Quota() throttle.Quota { return throttle.Quota{Limit: math.MaxInt} }

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
