package window

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
)

// Params is what Limits and Algorithm read of a window configuration.
type Params struct {
	Limit  int64 // units per window
	Window int64 // window length in ns
	Max    int64 // the largest limit the configuration's counters hold
}

// Quota is the limit per window (zero for zero Params).
func (p Params) Quota() throttle.Quota {
	return throttle.Quota{Limit: int(p.Limit), Window: time.Duration(p.Window)}
}

// Config is the configuration of a fixed- or sliding-window package, as
// *C: its Params, a copy of it under another limit (in the same layout),
// and its pure step for Algorithm.
type Config[C any] interface {
	*C
	Params() Params
	WithLimit(limit int) (*C, error)
	CheckN(n int) error
	StepDecision(d *throttle.Decision, old, now, n int64) int64
}

// ErrZero is the error of a window limiter or Algorithm not made by its
// constructor.
var ErrZero = fmt.Errorf("%w: zero window limiter: use the constructor", throttle.ErrInvalid)

// Limits is the configuration of a keyed window limiter, replaced whole
// by SetLimit. fixedwindow.Limiter and slidingwindow.Limiter embed it for
// their Limit, SetLimit, Capacity and Quota; Load and Store reach the
// configuration. Safe for concurrent use; the zero value holds none.
type Limits[C any, P Config[C]] struct{ cur atomic.Pointer[C] }

// Load returns the current configuration of l, nil if none.
func Load[C any, P Config[C]](l *Limits[C, P]) *C { return l.cur.Load() }

// Store sets the configuration of l.
func Store[C any, P Config[C]](l *Limits[C, P], c *C) { l.cur.Store(c) }

// ParamsOf returns the Params of c, zero for a nil c.
func ParamsOf[C any, P Config[C]](c *C) Params {
	if c == nil {
		return Params{}
	}
	return P(c).Params()
}

// Limit returns the limit per window (0 on a zero limiter).
func (l *Limits[C, P]) Limit() int { return int(ParamsOf[C, P](l.cur.Load()).Limit) }

// Capacity returns the largest limit SetLimit accepts: what the counters
// sized at New hold (0 on a zero limiter).
func (l *Limits[C, P]) Capacity() int { return int(ParamsOf[C, P](l.cur.Load()).Max) }

// Quota reports the limit per window (zero on a zero limiter).
func (l *Limits[C, P]) Quota() throttle.Quota { return ParamsOf[C, P](l.cur.Load()).Quota() }

// SetLimit changes the limit per window, keeping what each key has used:
// a key over a lowered limit is denied until its units leave the window.
// The counters are sized for the limit given to New: limit may be up to
// Capacity(). A decision racing with SetLimit is judged against either
// limit. Errors wrap throttle.ErrInvalid.
func (l *Limits[C, P]) SetLimit(limit int) error {
	for {
		c := l.cur.Load()
		if c == nil {
			return ErrZero
		}
		nc, err := P(c).WithLimit(limit)
		if err != nil {
			return err
		}
		if l.cur.CompareAndSwap(c, nc) {
			return nil
		}
	}
}

// Algorithm is the pure step that fixedwindow.Algorithm and
// slidingwindow.Algorithm embed: storelimit.Algorithm over the packed word
// of their configuration. Immutable; the zero value fails with ErrZero.
type Algorithm[C any, P Config[C]] struct {
	c   *C
	pkg string
}

// NewAlgorithm returns the Algorithm of c, naming pkg in its errors.
func NewAlgorithm[C any, P Config[C]](pkg string, c *C) Algorithm[C, P] {
	return Algorithm[C, P]{c: c, pkg: pkg}
}

// Decide decides n units at now (nanoseconds since the Unix epoch) on a
// key whose state is state. It returns the state to store (state itself
// when denied) and the Decision. Errors wrap throttle.ErrInvalid (n <= 0,
// a zero Algorithm, a state no Algorithm of this limit wrote) or
// throttle.ErrExceedsLimit (n > limit).
func (a Algorithm[C, P]) Decide(state, now int64, n int) (next int64, d throttle.Decision, err error) {
	if a.c == nil {
		return state, d, ErrZero
	}
	c := P(a.c)
	if err := c.CheckN(n); err != nil {
		return state, d, err
	}
	if state < 0 {
		return state, d, fmt.Errorf("%w: %s: state %#x was not written by an Algorithm", throttle.ErrInvalid, a.pkg, state)
	}
	next = c.StepDecision(&d, state, now, int64(n))
	if !d.Allowed {
		next = state
	}
	return next, d, nil
}

// Fresh returns 0, the state of a key never seen.
func (Algorithm[C, P]) Fresh() int64 { return 0 }

// Quota reports the limit per window (zero on a zero Algorithm).
func (a Algorithm[C, P]) Quota() throttle.Quota { return ParamsOf[C, P](a.c).Quota() }
