package leakybucket

import (
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

// algorithm is the step this package shares with tokenbucket.
type algorithm = gcra.Algorithm

// Algorithm is the meter's decision as a pure function, for a store that
// keeps each key's state itself (see storelimit.Store and package
// storelimit): read the state, Decide, and write the next state back only
// if the stored one is still the state read, else decide again. The state
// is one int64, the instant in nanoseconds since the Unix epoch at which
// the bucket is empty again; Fresh returns that of a new key (empty at
// any instant). The buckets of this
// package run the same step in their compare-and-swap loop; Decide's
// decisions are theirs on the same trace (and those of
// tokenbucket.Algorithm of the same rate and burst).
//
// Its methods are storelimit.Algorithm's. Decide(state, now, n) pours n
// units into a bucket whose state is state, if they fit, and returns the
// state to store (state itself when denied) and the Decision (see
// Bucket.AllowN); errors wrap throttle.ErrInvalid (n <= 0, a zero
// Algorithm, a bucket that would be empty only after 2262) or
// throttle.ErrExceedsLimit (n > capacity). Quota
// reports the capacity and the time to drain it (zero on a zero
// Algorithm).
//
// An Algorithm is immutable and safe for concurrent use. The zero value
// is not usable: Decide fails with an error wrapping throttle.ErrInvalid;
// create it with NewAlgorithm.
type Algorithm struct{ algorithm }

// NewAlgorithm returns the decision of a bucket of the given capacity
// draining at rate. Errors wrap throttle.ErrInvalid.
func NewAlgorithm(rate throttle.Rate, capacity int) (Algorithm, error) {
	g, err := gcra.NewAlgorithm(rate, capacity)
	return Algorithm{g}, err
}
