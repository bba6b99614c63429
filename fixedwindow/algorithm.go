package fixedwindow

import (
	"time"

	"github.com/throttlekit/throttle/internal/window"
)

// Algorithm is the fixed window's decision as a pure function, for a store
// that keeps each key's state itself (a SQL row, a Memcached item): read
// the state, Decide, and write the next state back only if the stored one
// is still the state read (a compare-and-swap or a transaction), else
// decide again. The state is one opaque int64 (the window and its count
// packed), 0 for a new key. The limiters of this package run the same step
// in their compare-and-swap loop; Decide's decisions are theirs on the
// same trace.
//
// Its methods are storelimit.Algorithm's. Decide(state, now, n) decides n
// units at now (nanoseconds since the Unix epoch) on a key whose state is
// state, and returns the state to store (state itself when denied) and
// the Decision; errors wrap throttle.ErrInvalid (n <= 0, a zero
// Algorithm, a state no Algorithm of this limit wrote) or
// throttle.ErrExceedsLimit (n > limit). Fresh returns 0, the state of a
// key never seen. Quota reports the limit per window (zero on a zero
// Algorithm).
//
// An Algorithm is immutable and safe for concurrent use. The zero value
// is not usable: Decide fails with an error wrapping throttle.ErrInvalid.
type Algorithm struct{ algorithm }

// NewAlgorithm returns the decision of limit units per window, windows
// aligned to the clock, or opened by a key's first hit when anchored.
// Errors wrap throttle.ErrInvalid.
func NewAlgorithm(limit int, window time.Duration, anchored bool) (Algorithm, error) {
	c, err := newConfig(limit, window, anchored)
	if err != nil {
		return Algorithm{}, err
	}
	return Algorithm{newAlgorithm(c)}, nil
}

func newAlgorithm(c *config) algorithm { return window.NewAlgorithm[config]("fixedwindow", c) }
