package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
)

// ThrottledTransport is an http.RoundTripper with client-side adaptive
// throttling (see adaptive.Throttler): it drops a request locally, failing
// with a *throttle.LimitedError (errors.Is(err, throttle.ErrLimited)),
// with the probability the Throttler gives, so an overloaded upstream is
// not drowned by requests it would refuse. A response counts as accepted
// unless its status is 429 or 503; a transport error does not count,
// except when the request's own context ended it; a request Base did not
// send (adaptive.NotSent: a Transport's limiter refused it) is withdrawn,
// counting neither as a request nor as a rejection. It is safe for
// concurrent use.
type ThrottledTransport struct {
	// Base makes the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Throttler decides; it must not be nil. Share one per upstream
	// among the clients of that upstream.
	Throttler *adaptive.Throttler
}

var _ http.RoundTripper = (*ThrottledTransport)(nil)

// RoundTrip asks the Throttler, then Base.
func (t *ThrottledTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.Throttler == nil {
		return nil, fmt.Errorf("%w: httplimit: ThrottledTransport with a nil Throttler", throttle.ErrInvalid)
	}
	d, err := t.Throttler.Allow(r.Context(), r.URL.Host, 1)
	if err != nil {
		return nil, err
	}
	if !d.Allowed {
		return nil, &throttle.LimitedError{Key: r.URL.Host, Decision: d}
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	switch {
	case adaptive.NotSent(err):
		t.Throttler.Withdraw(1)
	case accepted(r.Context(), resp, err):
		t.Throttler.Accept(1)
	}
	return resp, err
}

// accepted tells whether the upstream accepted a request: it answered
// with anything but 429 or 503, or the caller gave up first.
func accepted(ctx context.Context, resp *http.Response, err error) bool {
	if err != nil {
		return ctx.Err() != nil && errors.Is(err, context.Canceled)
	}
	return resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable
}
