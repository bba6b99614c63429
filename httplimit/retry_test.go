package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/retry"
)

// script answers with the given statuses in turn (the last one after
// that), with Retry-After when after is set, and records the bodies it
// was sent.
func script(after string, statuses ...int) (http.RoundTripper, *[]string) {
	var bodies []string
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		b := ""
		if r.Body != nil {
			raw, _ := io.ReadAll(r.Body)
			b = string(raw)
		}
		bodies = append(bodies, b)
		st := statuses[min(len(bodies), len(statuses))-1]
		h := http.Header{}
		if after != "" {
			h.Set("Retry-After", after)
		}
		return &http.Response{StatusCode: st, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}), &bodies
}

func TestRetryTransport(t *testing.T) {
	policy := &retry.Policy{MaxAttempts: 4, MaxRetryAfter: 10 * time.Second}
	for _, tc := range []struct {
		name      string
		method    string
		key       string
		anyMethod bool
		after     string
		statuses  []int
		attempts  int
		wait      time.Duration
	}{
		{"503 then 200", "GET", "", false, "", []int{503, 503, 200}, 3, 0},
		{"attempt cap", "GET", "", false, "", []int{502}, 4, 0},
		{"not retryable", "GET", "", false, "", []int{500}, 1, 0},
		{"Retry-After waited", "GET", "", false, "3", []int{429, 200}, 2, 3 * time.Second},
		{"Retry-After above the bound", "GET", "", false, "60", []int{429, 200}, 1, 0},
		// Before, read as absent: retried at once (5 attempts in 396 ms).
		{"Retry-After overflowing", "GET", "", false, "99999999999999999999", []int{429, 200}, 1, 0},
		{"POST not retried", "POST", "", false, "", []int{503, 200}, 1, 0},
		{"POST with an Idempotency-Key", "POST", "k1", false, "", []int{503, 200}, 2, 0},
		{"POST when told", "POST", "", true, "", []int{503, 200}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base, bodies := script(tc.after, tc.statuses...)
				c := &http.Client{Transport: &httplimit.RetryTransport{Base: base, Policy: policy, RetryNonIdempotent: tc.anyMethod}}
				r, _ := http.NewRequest(tc.method, "http://upstream.test/", strings.NewReader("payload"))
				if tc.key != "" {
					r.Header.Set("Idempotency-Key", tc.key)
				}
				start := time.Now()
				resp, err := c.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if len(*bodies) != tc.attempts {
					t.Fatalf("%d attempts, want %d", len(*bodies), tc.attempts)
				}
				for i, b := range *bodies {
					if b != "payload" {
						t.Fatalf("attempt %d sent body %q", i+1, b)
					}
				}
				if el := time.Since(start); el < tc.wait {
					t.Fatalf("took %v, want at least %v", el, tc.wait)
				}
			})
		})
	}
}

// TestRetryAfterSpread: 100 clients refused together with Retry-After: 1
// come back over a spread of at least 100 ms (up to a fifth more than
// asked), none before the second asked for. Before, all 100 retries
// landed at the same instant, 1 s later.
func TestRetryAfterSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var first, last time.Duration = time.Hour, 0
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() {
				base, _ := script("1", 503, 200)
				c := &http.Client{Transport: &httplimit.RetryTransport{Base: base}}
				resp, err := c.Get("http://upstream.test/")
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				el := time.Since(start)
				mu.Lock()
				first, last = min(first, el), max(last, el)
				mu.Unlock()
			})
		}
		wg.Wait()
		if first < time.Second || last > 1200*time.Millisecond || last-first < 100*time.Millisecond {
			t.Errorf("retries from %v to %v: want a spread of at least 100ms within [1s, 1.2s]", first, last)
		}
	})
}

// TestRetryPastDeadline: a Retry-After longer than the request's remaining
// deadline is not waited for: the caller gets the upstream's 503 at once.
// Before, RetryTransport slept into the deadline and the caller got
// context.DeadlineExceeded instead of the answer.
func TestRetryPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, bodies := script("5", 503, 200)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream.test/", nil)
		start := time.Now()
		resp, err := (&http.Client{Transport: &httplimit.RetryTransport{Base: base}}).Do(r)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || len(*bodies) != 1 || time.Since(start) != 0 {
			t.Fatalf("got %v, %v after %d attempts and %v; want the 503 at once", resp, err, len(*bodies), time.Since(start))
		}
		resp.Body.Close()
	})
}

// A client of one upstream with the three protections stacked: retries
// (idempotent requests, up to 3 attempts, within a budget shared by every
// client of that upstream) outermost, so that each attempt passes the
// SRE throttle and then an adaptive limit on requests in flight.
func ExampleRetryTransport() {
	budget, err := retry.NewBudget(10, 0.1)
	if err != nil {
		panic(err)
	}
	policy := &retry.Policy{MaxAttempts: 3, MaxRetryAfter: 5 * time.Second, Budget: budget}
	th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{})
	if err != nil {
		panic(err)
	}
	lim, err := adaptive.New(&adaptive.Vegas{}, adaptive.Config{})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &httplimit.RetryTransport{Policy: policy,
		Base: &httplimit.ThrottledTransport{Throttler: th,
			Base: &httplimit.Transport{Limiter: lim}}}}
	_ = client
}

// FuzzRetryAfter: whatever Retry-After an upstream sends (huge, negative,
// a date, garbage), RetryTransport never waits longer than the policy's
// bound and never panics.
func FuzzRetryAfter(f *testing.F) {
	for _, v := range []string{"1", "0", "-5", "99999999999999999999", "9223372036", "Wed, 21 Oct 2015 07:28:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", " 2 ", "1.5", "\x00"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, after string) {
		synctest.Test(t, func(t *testing.T) {
			p := &retry.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxRetryAfter: 2 * time.Second}
			base, bodies := script(after, 429, 200)
			r, _ := http.NewRequest("GET", "http://upstream.test/", nil)
			start := time.Now()
			resp, err := (&httplimit.RetryTransport{Base: base, Policy: p}).RoundTrip(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if el := time.Since(start); el > 2*time.Second || len(*bodies) > 2 {
				t.Fatalf("Retry-After %q: waited %v, %d attempts", after, el, len(*bodies))
			}
		})
	})
}
