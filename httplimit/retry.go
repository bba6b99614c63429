package httplimit

import (
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/retry"
)

// RetryTransport is an http.RoundTripper that retries failed requests
// under a retry.Policy: transport errors, 429, 502, 503 and 504, after
// the policy's jittered back-off or the response's Retry-After (seconds
// or a date, spread by up to a fifth more), whichever is longer, up to
// the policy's bound; a wait that would end past the request's deadline
// is not started, and the last answer is returned. A request a local
// limiter refused (adaptive.NotSent) is retried without charging the
// policy's Budget. Only
// idempotent requests are retried (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE, or any with an Idempotency-Key header), unless
// RetryNonIdempotent is set, and only if their body can be read again
// (http.Request.GetBody). Put it in front of a Transport so that every
// attempt asks the limiter. It is safe for concurrent use.
type RetryTransport struct {
	// Base makes the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Policy decides; nil means the zero retry.Policy (defaults, no
	// budget). Share one Policy, and its Budget, per upstream.
	Policy *retry.Policy
	// RetryNonIdempotent retries POST and PATCH requests too.
	RetryNonIdempotent bool
}

var _ http.RoundTripper = (*RetryTransport)(nil)

// RoundTrip sends r, and sends it again while the policy allows.
func (t *RetryTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	base, p := t.Base, t.Policy // a nil Policy is the defaults
	if base == nil {
		base = http.DefaultTransport
	}
	canRetry := (t.RetryNonIdempotent || idempotent(r)) &&
		(r.Body == nil || r.Body == http.NoBody || r.GetBody != nil)
	ctx := r.Context()
	req := r
	for attempt := 1; ; attempt++ {
		resp, err := base.RoundTrip(req)
		again, hint := retryable(resp, err)
		if !again || ctx.Err() != nil {
			if err == nil && resp.StatusCode < 500 {
				p.Succeeded()
			}
			return resp, err
		}
		if !canRetry {
			return resp, err
		}
		delay, ok := p.NextCall(ctx, attempt, hint, err)
		if !ok {
			return resp, err
		}
		if resp != nil { // let the connection be reused
			_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
			resp.Body.Close()
		}
		if werr := retry.Sleep(ctx, delay); werr != nil {
			return nil, werr
		}
		req = r.Clone(ctx)
		if r.GetBody != nil {
			if req.Body, err = r.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// retryable tells whether an attempt failed in a way worth retrying, and
// the wait the server asked for.
func retryable(resp *http.Response, err error) (bool, time.Duration) {
	if err != nil {
		if le := (*throttle.LimitedError)(nil); errors.As(err, &le) {
			return true, le.Decision.RetryAfter
		}
		return true, 0
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true, retryAfter(resp.Header.Get("Retry-After"))
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return true, 0
	}
	return false, 0
}

// retryAfter parses a Retry-After value: seconds or an HTTP date; 0 if
// absent or malformed. Seconds too many for an int64 are the longest
// Duration: longer than any MaxRetryAfter, not absent.
func retryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) && v[0] != '-' {
		if err != nil || s >= int64(math.MaxInt64/time.Second) {
			return math.MaxInt64
		}
		return time.Duration(max(s, 0)) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

func idempotent(r *http.Request) bool {
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return r.Header.Get("Idempotency-Key") != "" || r.Header.Get("X-Idempotency-Key") != ""
}
