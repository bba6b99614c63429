package httplimit_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/throttletest"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// answer returns a RoundTripper answering every request with status, and
// the count of requests it saw.
func answer(status int) (http.RoundTripper, *int) {
	n := new(int)
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		*n++
		return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}), n
}

// TestThrottledTransport: an upstream answering 503 gets a fraction of the
// requests (429 and 503 are not accepts); one answering 404 gets them
// all.
func TestThrottledTransport(t *testing.T) {
	for _, tc := range []struct {
		status    int
		dropsSome bool
	}{{http.StatusServiceUnavailable, true}, {http.StatusTooManyRequests, true}, {http.StatusNotFound, false}} {
		th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{}, throttle.WithClock(throttletest.NewClock()))
		if err != nil {
			t.Fatal(err)
		}
		base, seen := answer(tc.status)
		c := &http.Client{Transport: &httplimit.ThrottledTransport{Base: base, Throttler: th}}
		dropped := 0
		for range 1000 {
			resp, err := c.Get("http://upstream.test/")
			switch {
			case errors.Is(err, throttle.ErrLimited):
				dropped++
			case err != nil:
				t.Fatal(err)
			default:
				resp.Body.Close()
			}
		}
		if got := dropped > 0; got != tc.dropsSome || dropped+*seen != 1000 {
			t.Errorf("status %d: %d dropped, %d sent", tc.status, dropped, *seen)
		}
	}
}

// A client that backs off locally when its upstream answers 429 or 503:
// share one Throttler among the clients of one upstream.
func ExampleThrottledTransport() {
	th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{K: 2})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &httplimit.ThrottledTransport{Throttler: th}}
	_ = client // client.Get(...) fails with throttle.ErrLimited when dropped
}
