package gcra

import (
	"fmt"
	"math"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/limiterkit"
)

// Full is the TAT of a bucket never used: full (or empty, seen as a leaky
// bucket) at any instant.
const Full = math.MinInt64

// Algorithm is the pure step of tokenbucket.Algorithm and
// leakybucket.Algorithm, which differ only in their names. The zero value
// fails with ErrInvalid, naming pkg.
type Algorithm struct{ c *Config }

// NewAlgorithm validates rate and burst. Errors wrap throttle.ErrInvalid.
func NewAlgorithm(rate throttle.Rate, burst int) (Algorithm, error) {
	c, err := NewConfig(rate, burst)
	if err != nil {
		return Algorithm{}, err
	}
	return Algorithm{c}, nil
}

// Decide is throttle.Algorithm's Decide on the TAT state; pkg names the
// Algorithm in the error of a zero one.
func (a Algorithm) Decide(pkg string, state, now int64, n int) (next int64, d throttle.Decision, err error) {
	if a.c == nil {
		return state, d, fmt.Errorf("%w: zero %s.Algorithm: use NewAlgorithm", throttle.ErrInvalid, pkg)
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

// Quota is the burst and the time to earn it (zero on a zero Algorithm).
func (a Algorithm) Quota() throttle.Quota {
	if a.c == nil {
		return throttle.Quota{}
	}
	return throttle.Quota{Limit: a.c.Burst, Window: a.c.Rate.Duration(int64(a.c.Burst))}
}
