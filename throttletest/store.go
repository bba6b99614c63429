package throttletest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

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
