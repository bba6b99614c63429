package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Limit each client to 100 requests a minute, behind one nginx proxy
// (at 10.0.0.0/8) that appends the address it saw to X-Forwarded-For
// (proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for).
func Example() {
	l, err := fixedwindow.New(100, time.Minute)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	limit, err := httplimit.New(l,
		httplimit.WithKey(httplimit.ClientIP(
			httplimit.TrustProxy("X-Forwarded-For", 1), // the rightmost address: what nginx saw
			httplimit.TrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))),
		httplimit.WithName("per-client"))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.1.2.3:5555"
	r.Header.Set("X-Forwarded-For", "192.0.2.66, 203.0.113.9") // the client wrote 192.0.2.66
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	// Output: 200 "per-client";q=100;w=60
}

// Try a new, stricter limit on production traffic: it decides and sends
// its RateLimit fields, but refuses nothing; health checks are exempt.
func ExampleWithShadow() {
	l, err := fixedwindow.NewAnchored(1, time.Minute)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	trial, err := httplimit.New(l, httplimit.WithName("trial"), httplimit.WithShadow(),
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	if err != nil {
		panic(err)
	}
	h := trial(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/", "/", "/healthz"} {
		r := httptest.NewRequest("GET", path, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(path, w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// / 200 "trial";r=0;t=60
	// / 200 "trial";r=0;t=60
	// /healthz 200
}

// A handler before the limit knows what a request costs (here, a batch's
// size) and says so in its context.
func ExampleCostFromContext() {
	l, err := fixedwindow.NewAnchored(100, time.Minute)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	limit, err := httplimit.New(l, httplimit.WithCost(httplimit.CostFromContext(1)))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	batch := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := len(r.URL.Query()["id"])
			next.ServeHTTP(w, r.WithContext(httplimit.WithRequestCost(r.Context(), max(n, 1))))
		})
	}
	w := httptest.NewRecorder()
	batch(h).ServeHTTP(w, httptest.NewRequest("GET", "/items?id=1&id=2&id=3", nil))
	fmt.Println(w.Code, w.Header().Get("RateLimit"))
	// Output: 200 "default";r=97;t=60
}

// Each caller's plan, known to a handler before the limit, sets its limit
// without a rules document.
func ExampleWithRequestLimit() {
	l, err := tokenbucket.New(throttle.PerSecond(10), 20) // the default plan
	if err != nil {
		panic(err)
	}
	defer l.Close()
	limit, err := httplimit.New(l, httplimit.WithLimitFromContext(), httplimit.WithKey(httplimit.Header("X-API-Key")))
	if err != nil {
		panic(err)
	}
	plans := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-API-Key") == "trial-key" {
				r = r.WithContext(httplimit.WithRequestLimit(r.Context(), throttle.NewRate(60, time.Minute), 10))
			}
			next.ServeHTTP(w, r)
		})
	}
	h := plans(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	for _, key := range []string{"trial-key", "paid-key"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(key, w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// trial-key 200 "default";q=10;w=10
	// paid-key 200 "default";q=20;w=2
}
