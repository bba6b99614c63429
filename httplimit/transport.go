package httplimit

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/unsent"
)

// Transport is an http.RoundTripper that asks Limiter before each request
// to a rate-limited upstream: it waits its turn (Wait true, booking a slot
// when the limiter can reserve) or fails fast with a *throttle.LimitedError
// (errors.Is(err, throttle.ErrLimited)) carrying the Decision. A
// throttle.Holder is held until the response body is closed. The request's
// context bounds the wait.
type Transport struct {
	// Base makes the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Limiter decides; it must not be nil.
	Limiter throttle.Limiter
	// Key returns the key of a request; nil means its URL's host.
	Key func(*http.Request) string
	// Wait makes RoundTrip wait for capacity instead of failing.
	Wait bool
	// WaitOptions are passed to throttle.Wait.
	WaitOptions []throttle.WaitOption
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip asks the limiter, then Base. An error before the request is
// sent (a refusal, a wait that ended) wraps adaptive.ErrNotSent or is a
// *throttle.LimitedError, so the layers in front of this one (a
// ThrottledTransport, a RetryTransport) count it as never sent. When Base
// fails the same way, a Holder's units are released as saying nothing
// about the upstream (an adaptive.Limiter's Outcome is Ignored).
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.Limiter == nil {
		return nil, fmt.Errorf("%w: httplimit: Transport with a nil Limiter", throttle.ErrInvalid)
	}
	key := r.URL.Host
	if t.Key != nil {
		key = t.Key(r)
	}
	ctx, hold := unsent.Begin(r.Context(), t.Limiter)
	release, err := t.turn(ctx, key)
	if err != nil {
		hold.End(func() {}, err)
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	if err != nil || resp.Body == nil {
		hold.End(release, err)
		return resp, err
	}
	done := func() { hold.End(release, nil) }
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection (a WebSocket): its body is written too.
		resp.Body = &releasingConn{releasingBody{ReadCloser: rw, release: done}, rw}
		return resp, nil
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: done}
	return resp, nil
}

// turn waits for the limiter, or asks it once, and returns the release of
// what it holds; its errors are marked as not sent.
func (t *Transport) turn(ctx context.Context, key string) (func(), error) {
	switch h, holds := t.Limiter.(throttle.Holder); {
	case t.Wait && holds:
		rel, err := h.Hold(ctx, key, 1)
		return rel, unsent.Mark(err)
	case t.Wait:
		return func() {}, unsent.Mark(throttle.Wait(ctx, t.Limiter, key, 1, t.WaitOptions...))
	}
	d, rel, err := throttle.TryHold(ctx, t.Limiter, key, 1)
	switch {
	case err != nil:
		return nil, unsent.Mark(err)
	case !d.Allowed:
		return nil, &throttle.LimitedError{Key: key, Decision: d}
	}
	return rel, nil
}

// releasingConn is the body of a 101 response: the connection, writable.
type releasingConn struct {
	releasingBody
	w io.Writer
}

func (c *releasingConn) Write(p []byte) (int, error) { return c.w.Write(p) }

type releasingBody struct {
	io.ReadCloser
	release func()
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}
