package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
)

// Limit each client, behind a load balancer at 10.0.0.0/8, to 100
// requests a minute.
func Example() {
	l, err := fixedwindow.New(100, time.Minute)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	limit, err := httplimit.New(l,
		httplimit.WithKey(httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))),
		httplimit.WithName("per-client"))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.1.2.3:5555"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	// Output: 200 "per-client";q=100;w=60
}
