package httplimit_test

import (
	"errors"
	"net/http/httptest"
	"testing"

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
