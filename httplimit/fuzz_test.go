package httplimit_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/httplimit"
)

// FuzzClientIP: whatever a client writes left of the element the trusted
// proxy appends, the key is that element's address.
func FuzzClientIP(f *testing.F) {
	f.Add("198.51.100.7, 10.0.0.2", `for=192.0.2.1;proto=http, for="[2001:db8::1]:80"`)
	f.Add("\r0.0.0.0", "for=unknown")
	f.Add(",,,", `for="`)
	byXFF := httplimit.ClientIP(httplimit.TrustProxy("X-Forwarded-For", 1))
	byFwd := httplimit.ClientIP(httplimit.TrustProxy("Forwarded", 1))
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:5"
		r.Header["X-Forwarded-For"] = []string{xff + ", 198.51.100.7"}
		r.Header["Forwarded"] = []string{fwd, `for="[2001:db8::1]:80";proto=http`}
		if key, err := byXFF(r); err != nil || key != "198.51.100.7" {
			t.Fatalf("X-Forwarded-For %q: %q, %v", xff, key, err)
		}
		if key, err := byFwd(r); err != nil || key != "2001:db8::/64" {
			t.Fatalf("Forwarded %q: %q, %v", fwd, key, err)
		}
		// Read alone, any text gives an address, a token, or ErrInvalid.
		r.Header["Forwarded"] = []string{fwd}
		if _, err := byFwd(r); err != nil && !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("error %v does not wrap ErrInvalid", err)
		}
	})
}

// FuzzFields: the structured fields stay one line of printable ASCII with
// the name quoted, whatever the name and numbers.
func FuzzFields(f *testing.F) {
	f.Add("api", 10, int64(time.Minute), 3, int64(time.Second))
	f.Add(`a"b\c`, -1, int64(-1), -5, int64(1<<62))
	f.Fuzz(func(t *testing.T, name string, limit int, window int64, remaining int, reset int64) {
		for _, s := range []string{
			httplimit.PolicyField(name, throttle.Quota{Limit: limit, Window: time.Duration(window)}),
			httplimit.LimitField(name, remaining, time.Duration(reset)),
		} {
			if !strings.HasPrefix(s, `"`) || strings.Contains(s, ";q=-") || strings.Contains(s, ";r=-") || strings.Contains(s, ";t=-") {
				t.Fatalf("field %q", s)
			}
		}
	})
}
