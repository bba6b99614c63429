package gcra

import (
	"fmt"
	"math"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Full is the TAT of a bucket never used: full (or empty, seen as a leaky
// bucket) at any instant.
const Full = math.MinInt64

// Algorithm is the pure step that tokenbucket.Algorithm and
// leakybucket.Algorithm embed: they differ only in their names. It is
// storelimit.Algorithm on the TAT state. The zero value fails with
// ErrInvalid.
type Algorithm struct{ c *Config }

// NewAlgorithm validates rate and burst. Errors wrap throttle.ErrInvalid.
func NewAlgorithm(rate throttle.Rate, burst int) (Algorithm, error) {
	c, err := NewConfig(rate, burst)
	if err != nil {
		return Algorithm{}, err
	}
	return Algorithm{c}, nil
}

// errZeroAlgorithm is the error of a zero Algorithm's Decide.
var errZeroAlgorithm = fmt.Errorf("%w: zero Algorithm: use NewAlgorithm", throttle.ErrInvalid)

// Decide decides n units at now on a key whose state is state. It
// returns the state to store (state itself when denied) and the
// Decision. Errors wrap throttle.ErrInvalid (n <= 0, a zero Algorithm, a
// TAT past 2262) or throttle.ErrExceedsLimit (n > burst).
func (a Algorithm) Decide(state, now int64, n int) (next int64, d throttle.Decision, err error) {
	if a.c == nil {
		return state, d, errZeroAlgorithm
	}
	if err := limiterkit.CheckN(n, a.c.Burst); err != nil {
		return state, d, err
	}
	cost := int64(n) * a.c.Interval
	next, ok := Step(state, now, cost, a.c.Tau)
	if err := a.c.Fill(&d, now, next, cost, ok); err != nil {
		return state, throttle.Decision{}, err
	}
	if !ok {
		next = state
	}
	return next, d, nil
}

// Fresh returns Full, the state of a key never seen.
func (Algorithm) Fresh() int64 { return Full }

// Quota is the burst and the time to earn it (zero on a zero Algorithm).
func (a Algorithm) Quota() throttle.Quota { return QuotaOf(a.c) }
