package httplimit

import (
	"fmt"
	"io"
	"net/http"

	"github.com/throttlekit/throttle"
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

// RoundTrip asks the limiter, then Base.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.Limiter == nil {
		return nil, fmt.Errorf("%w: httplimit: Transport with a nil Limiter", throttle.ErrInvalid)
	}
	key := r.URL.Host
	if t.Key != nil {
		key = t.Key(r)
	}
	release := func() {}
	switch h, holds := t.Limiter.(throttle.Holder); {
	case t.Wait && holds:
		rel, err := h.Hold(r.Context(), key, 1)
		if err != nil {
			return nil, err
		}
		release = rel
	case t.Wait:
		if err := throttle.Wait(r.Context(), t.Limiter, key, 1, t.WaitOptions...); err != nil {
			return nil, err
		}
	default:
		d, rel, err := throttle.TryHold(r.Context(), t.Limiter, key, 1)
		if err != nil {
			return nil, err
		}
		if !d.Allowed {
			return nil, &throttle.LimitedError{Key: key, Decision: d}
		}
		release = rel
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	if err != nil || resp.Body == nil {
		release()
		return resp, err
	}
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection (a WebSocket): its body is written too.
		resp.Body = &releasingConn{releasingBody{ReadCloser: rw, release: release}, rw}
		return resp, nil
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: release}
	return resp, nil
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
