// Package unsent marks the errors of requests that never left the
// client: a local limiter refused them, or the caller gave up waiting for
// its turn. The layers that count what a backend answers (a Throttler, an
// adaptive limit, a retry budget) count such a request neither as a
// request nor as a failure.
package unsent

import (
	"context"
	"errors"

	"github.com/throttlekit/throttle"
)

// Err is wrapped by the errors Mark returns.
var Err = errors.New("request not sent")

// Is reports whether err says its request never reached the backend: it
// wraps Err, or throttle.ErrLimited (a limiter's refusal: the call was
// not run).
func Is(err error) bool {
	return err != nil && (errors.Is(err, Err) || errors.Is(err, throttle.ErrLimited))
}

// Mark returns err marked as unsent; its message is err's, and it still
// wraps err. It returns nil for nil, and err itself when Is(err).
func Mark(err error) error {
	if err == nil || Is(err) {
		return err
	}
	return marked{err}
}

type marked struct{ err error }

func (m marked) Error() string   { return m.err.Error() }
func (m marked) Unwrap() []error { return []error{m.err, Err} }

// Hold scopes the units of a throttle.Holder held for one request, so
// that a request that turns out not sent is released as saying nothing
// about the backend: an adaptive limit's release reports Ignored for a
// cancelled context. The zero Hold (for a limiter that holds nothing)
// does nothing but release.
type Hold struct{ cancel context.CancelFunc }

// Begin returns the context to hold l's units under: ctx itself unless l
// is a throttle.Holder.
func Begin(ctx context.Context, l throttle.Limiter) (context.Context, Hold) {
	if _, ok := l.(throttle.Holder); !ok {
		return ctx, Hold{}
	}
	ctx, cancel := context.WithCancel(ctx)
	return ctx, Hold{cancel}
}

// End releases the units after the request ended with err: when Is(err),
// with the hold's context cancelled first.
func (h Hold) End(release func(), err error) {
	if h.cancel == nil {
		release()
		return
	}
	if Is(err) {
		h.cancel()
	}
	release()
	h.cancel()
}
