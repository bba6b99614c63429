package httplimit_test

import (
	"errors"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/httplimit"
)

// FuzzClientIP: any forwarding header either yields a valid address key or
// an error wrapping ErrInvalid, never a panic, and never a trusted proxy's
// address while an untrusted hop stands to its right.
func FuzzClientIP(f *testing.F) {
	f.Add("198.51.100.7, 10.0.0.2", `for=192.0.2.1;proto=http, for="[2001:db8::1]:80"`)
	f.Add("\r0.0.0.0", "for=unknown")
	f.Add(",,,", `for="`)
	k := httplimit.IPKey{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:5"
		r.Header["X-Forwarded-For"] = []string{xff}
		if fwd != "" {
			r.Header["Forwarded"] = []string{fwd}
		}
		key, err := k.Key(r)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if p, perr := netip.ParsePrefix(key); perr == nil {
			key = p.Addr().String()
		}
		if _, perr := netip.ParseAddr(key); perr != nil {
			t.Fatalf("key %q is not an address", key)
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
