package tokenbucket

import (
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

// algorithm is the step this package shares with leakybucket.
type algorithm = gcra.Algorithm

// Algorithm is the token bucket's decision as a pure function, for a store
// that keeps each key's state itself (a SQL row, a Memcached item): read
// the state, Decide, and write the next state back only if the stored one
// is still the state read (a compare-and-swap or a transaction), else
// decide again. The state is one int64, the instant in nanoseconds since
// the Unix epoch at which the bucket is full again; Fresh returns that of
// a new key (full at any instant).
// The buckets of this package run the same step in their
// compare-and-swap loop; Decide's decisions are theirs on the same trace.
//
// Its methods are storelimit.Algorithm's. Decide(state, now, n) returns the
// state to store (state itself when denied) and the Decision; errors wrap
// throttle.ErrInvalid (n <= 0, a zero Algorithm, a bucket that would be
// full again only after 2262) or throttle.ErrExceedsLimit (n > burst).
// Quota reports the burst and the time to refill it
// from empty (zero on a zero Algorithm).
//
// An Algorithm is immutable and safe for concurrent use. The zero value
// is not usable: Decide fails with an error wrapping throttle.ErrInvalid;
// create it with NewAlgorithm.
type Algorithm struct{ algorithm }

// NewAlgorithm returns the decision of a bucket of burst tokens refilled
// at rate. Errors wrap throttle.ErrInvalid.
func NewAlgorithm(rate throttle.Rate, burst int) (Algorithm, error) {
	g, err := gcra.NewAlgorithm(rate, burst)
	return Algorithm{g}, err
}
