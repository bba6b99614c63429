package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// frozen is a clock standing still at a window's start, for the tests
// that count exact admissions in a fixed window: on the wall clock a
// window could end between two requests (a proxy test once admitted 10
// of 40 where the limit is 5 a minute).
func frozen() throttle.Option { return throttle.WithClock(throttletest.NewClock()) }

func mw(t testing.TB, l throttle.Limiter, opts ...httplimit.Option) func(http.Handler) http.Handler {
	t.Helper()
	m, err := httplimit.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

func get(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestDeniedGets429WithFields(t *testing.T) {
	l, _ := fixedwindow.New(2, time.Minute, frozen())
	defer l.Close()
	h := mw(t, l, httplimit.WithName("api"), httplimit.WithLegacyHeaders())(ok)
	for i := range 2 {
		w := get(h, "192.0.2.1:1234")
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		if got := w.Header().Get("RateLimit-Policy"); got != `"api";q=2;w=60` {
			t.Fatalf("RateLimit-Policy = %q", got)
		}
		// Admitted, even the last unit: t is when the window resets (it
		// used to say 0 once nothing remained).
		if got, want := w.Header().Get("RateLimit"), fmt.Sprintf(`"api";r=%d;t=`, 1-i); !strings.HasPrefix(got, want) || strings.HasSuffix(got, "t=0") {
			t.Fatalf("RateLimit = %q, want %s<seconds to the window's end>", got, want)
		}
	}
	w := get(h, "192.0.2.1:1234")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: %d", w.Code)
	}
	ra := w.Header().Get("Retry-After")
	if ra == "" || ra == "0" {
		t.Fatalf("Retry-After = %q", ra)
	}
	if got := w.Header().Get("RateLimit"); got != `"api";r=0;t=`+ra {
		t.Fatalf("RateLimit = %q, Retry-After %s", got, ra)
	}
	if w.Header().Get("X-RateLimit-Limit") != "2" || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("legacy fields %v", w.Header())
	}
	// Another client is not affected.
	if w := get(h, "192.0.2.2:1"); w.Code != 200 {
		t.Fatalf("other client: %d", w.Code)
	}
}

func TestStackedPoliciesEachAddAnItem(t *testing.T) {
	a, _ := tokenbucket.New(throttle.PerSecond(10), 20)
	b, _ := fixedwindow.New(1000, time.Hour, frozen())
	defer a.Close()
	defer b.Close()
	h := mw(t, a, httplimit.WithName("burst"))(mw(t, b, httplimit.WithName("hourly"))(ok))
	w := get(h, "192.0.2.1:1")
	if got := w.Header().Values("RateLimit-Policy"); len(got) != 2 || got[0] != `"burst";q=20;w=2` || got[1] != `"hourly";q=1000;w=3600` {
		t.Fatalf("policies %q", got)
	}
}

func TestErrorStatuses(t *testing.T) {
	l, _ := tokenbucket.New(throttle.PerSecond(1), 2)
	defer l.Close()
	fail := func(err error) throttle.Limiter {
		return throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) { return throttle.Decision{}, err })
	}
	for _, c := range []struct {
		name string
		h    http.Handler
		want int
	}{
		{"no api key", mw(t, l, httplimit.WithKey(httplimit.Header("X-API-Key")))(ok), 400},
		{"cost above the burst", mw(t, l, httplimit.WithCost(func(*http.Request) int { return 3 }))(ok), 413},
		{"deny list", mw(t, fail(throttle.ErrDenied))(ok), 403},
		{"backend down", mw(t, fail(throttle.ErrUnavailable))(ok), 503},
		{"backend down, pass", mw(t, fail(throttle.ErrUnavailable), httplimit.WithPassOnUnavailable())(ok), 200},
	} {
		if w := get(c.h, "192.0.2.1:1"); w.Code != c.want {
			t.Errorf("%s: %d, want %d", c.name, w.Code, c.want)
		}
	}
	if _, err := httplimit.New(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
	if _, err := httplimit.New(l, httplimit.WithName("bad\nname")); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
}

// A concurrency limit is held while the handler runs and given back after
// it, also when it panics: 5 requests in a row on a limit of 1 all pass.
func TestHolderReleasedAfterHandler(t *testing.T) {
	l, _ := counting.New(1)
	defer l.Close()
	var inFlight int
	h := mw(t, l)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight = l.InFlight("192.0.2.1")
		if r.URL.Query().Has("panic") {
			panic("boom")
		}
	}))
	for i := range 5 {
		if w := get(h, "192.0.2.1:1"); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
		if inFlight != 1 {
			t.Fatalf("in flight during the handler: %d", inFlight)
		}
	}
	func() {
		defer func() { _ = recover() }()
		r := httptest.NewRequest("GET", "/?panic=1", nil)
		r.RemoteAddr = "192.0.2.1:1"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	if n := l.InFlight("192.0.2.1"); n != 0 {
		t.Fatalf("in flight after a panic: %d", n)
	}
}

func TestClientIP(t *testing.T) {
	xff := httplimit.TrustProxy("X-Forwarded-For", 1)
	fwd := httplimit.TrustProxy("Forwarded", 1)
	for _, c := range []struct {
		opts   []httplimit.IPOption
		remote string
		hdr    []string
		want   string // "" for ErrInvalid
	}{
		// No options: headers are never read.
		{nil, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6", "X-Real-IP", "6.6.6.6"}, "10.0.0.1"},
		{nil, "[192.0.2.1]:1234", nil, "192.0.2.1"}, // bracketed IPv4
		{nil, "192.0.2.1", nil, "192.0.2.1"},
		{nil, "[fe80::1%eth0]:5", nil, "fe80::/64"},
		{nil, "[2001:db8:1:2:3:4:5:6]:5", nil, "2001:db8:1:2::/64"},
		{[]httplimit.IPOption{httplimit.IPv6Prefix(48)}, "[2001:db8:1:2::6]:5", nil, "2001:db8:1::/48"},
		{nil, "not an address", nil, ""},
		{nil, "[192.0.2.1]x", nil, ""},
		// X-Forwarded-For: the hops-th from the right; the client's part is never read.
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6, 198.51.100.7"}, "198.51.100.7"},
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.7"}, "198.51.100.7"},
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "garbage, 198.51.100.7:4711"}, "198.51.100.7"},
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "198.51.100.7, , "}, "198.51.100.7"}, // empty elements
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"Forwarded", "for=6.6.6.6"}, "10.0.0.1"},                // not the trusted header
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", nil, "10.0.0.1"},                                                 // the proxy's own request
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6, garbage"}, ""},
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "\r0.0.0.0"}, ""},
		{[]httplimit.IPOption{httplimit.TrustProxy("x-forwarded-for", 2)}, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6, 198.51.100.7, 10.9.9.9"}, "198.51.100.7"},
		{[]httplimit.IPOption{httplimit.TrustProxy("X-Forwarded-For", 3)}, "10.0.0.1:5", []string{"X-Forwarded-For", "198.51.100.7, 10.9.9.9"}, "198.51.100.7"}, // fewer hops than proxies: all written by proxies
		{[]httplimit.IPOption{xff}, "10.0.0.1:5", []string{"X-Forwarded-For", "::ffff:198.51.100.7"}, "198.51.100.7"},
		// TrustedProxies: others are keyed by their peer.
		{[]httplimit.IPOption{xff, httplimit.TrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))}, "192.0.2.9:5", []string{"X-Forwarded-For", "6.6.6.6"}, "192.0.2.9"},
		{[]httplimit.IPOption{xff, httplimit.TrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))}, "10.0.0.1:5", []string{"X-Forwarded-For", "6.6.6.6"}, "6.6.6.6"},
		// Forwarded: the for= node of the hops-th element from the right.
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for=6.6.6.6, for="[2001:db8:1:2::3]:443";proto=https`}, "2001:db8:1:2::/64"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for=198.51.100.7`, "X-Forwarded-For", "6.6.6.6"}, "198.51.100.7"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for="6.6.6.6, for=198.51.100.7`}, "198.51.100.7"}, // a client's unclosed quote
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for=6.6.6.6;host="a,b", for=198.51.100.7;host="c,d";proto=http`}, "198.51.100.7"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `, for=198.51.100.7,`}, "198.51.100.7"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", "for=unknown"}, "unknown"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", "For=_hidden"}, "_hidden"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for="198.51.100.7:_port"`}, "198.51.100.7"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `proto=https`}, "unknown"},
		{[]httplimit.IPOption{fwd}, "10.0.0.1:5", []string{"Forwarded", `for="`}, ""},
		// A single-value header the proxy sets.
		{[]httplimit.IPOption{httplimit.TrustProxy("X-Real-IP", 1)}, "10.0.0.1:5", []string{"X-Real-IP", "198.51.100.7", "X-Forwarded-For", "6.6.6.6"}, "198.51.100.7"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for i := 0; i+1 < len(c.hdr); i += 2 {
			r.Header.Add(c.hdr[i], c.hdr[i+1])
		}
		got, err := httplimit.ClientIP(c.opts...)(r)
		if c.want == "" {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Errorf("%s %q: key %q, err %v; want ErrInvalid", c.remote, c.hdr, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s %q: key %q, %v; want %q", c.remote, c.hdr, got, err, c.want)
		}
	}
	// A huge header costs a walk of the hops read, and finds the client.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:5"
	r.Header.Set("X-Forwarded-For", strings.Repeat("1.1.1.1, ", 100000)+"198.51.100.7")
	if got, err := httplimit.ClientIP(xff)(r); err != nil || got != "198.51.100.7" {
		t.Errorf("huge header: %q, %v", got, err)
	}
	for _, bad := range [][]httplimit.IPOption{
		{httplimit.TrustProxy("X-Forwarded-For", 0)},
		{httplimit.TrustProxy("", 1)},
		{httplimit.IPv6Prefix(129)},
		{httplimit.TrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))}, // no header named
		{nil},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("ClientIP(%v) did not panic", bad)
				}
			}()
			httplimit.ClientIP(bad...)
		}()
	}
}

func TestDeniedHandler(t *testing.T) {
	l, _ := fixedwindow.New(1, time.Hour, frozen())
	defer l.Close()
	var seen throttle.Decision
	h := mw(t, l, httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = httplimit.DecisionFrom(r)
		w.WriteHeader(http.StatusTeapot)
	})))(ok)
	get(h, "192.0.2.1:1")
	if w := get(h, "192.0.2.1:1"); w.Code != http.StatusTeapot || seen.Allowed || seen.RetryAfter <= 0 {
		t.Fatalf("%d, %+v", w.Code, seen)
	}
}

// A real server on loopback, many clients at once: each key admitted
// exactly its limit.
func TestRealServer(t *testing.T) {
	l, _ := fixedwindow.New(5, time.Hour, frozen())
	defer l.Close()
	srv := httptest.NewServer(mw(t, l, httplimit.WithKey(httplimit.Header("X-API-Key")))(ok))
	defer srv.Close()
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			key := []string{"a", "b", "c", "d"}[i%4]
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-API-Key", key)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode == 200 {
				mu.Lock()
				admitted[key]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, k := range []string{"a", "b", "c", "d"} {
		if admitted[k] != 5 {
			t.Errorf("key %s admitted %d, want 5", k, admitted[k])
		}
	}
	srv.Client().CloseIdleConnections()
}

func TestTransport(t *testing.T) {
	var hits int
	var mu sync.Mutex
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	defer up.Close()
	l, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1) // once an hour per host
	defer l.Close()
	c := &http.Client{Transport: &httplimit.Transport{Base: up.Client().Transport, Limiter: l}}
	resp, err := c.Get(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, err = c.Get(up.URL)
	var le *throttle.LimitedError
	if !errors.Is(err, throttle.ErrLimited) || !errors.As(err, &le) || le.Decision.RetryAfter <= 0 {
		t.Fatalf("second call: %v", err)
	}
	// Waiting: the deadline is too near for the next slot, so it fails at once.
	cw := &http.Client{Transport: &httplimit.Transport{Base: up.Client().Transport, Limiter: l, Wait: true}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.URL, nil)
	if _, err := cw.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting call: %v", err)
	}
	if hits != 1 {
		t.Fatalf("upstream saw %d calls, want 1", hits)
	}
	// A concurrency limit is held until the body is closed.
	sem, _ := counting.New(1)
	defer sem.Close()
	cs := &http.Client{Transport: &httplimit.Transport{Base: up.Client().Transport, Limiter: sem}}
	resp, err = cs.Get(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Get(up.URL); !errors.Is(err, throttle.ErrLimited) {
		t.Fatalf("second concurrent call: %v", err)
	}
	resp.Body.Close()
	if sem.InFlight(strings.TrimPrefix(up.URL, "http://")) != 0 {
		t.Fatal("body closed, unit still held")
	}
	up.Client().CloseIdleConnections()
}

func BenchmarkMiddlewareAllowed(b *testing.B) {
	l, _ := tokenbucket.New(throttle.PerSecond(1_000_000_000), 1<<30)
	defer l.Close()
	h := mw(b, l)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
}

// TestMiddlewareAllocs pins what the guide states: 9 allocations per
// allowed request (the guide said 11).
func TestMiddlewareAllocs(t *testing.T) {
	l, _ := tokenbucket.New(throttle.PerSecond(1_000_000_000), 1<<30)
	defer l.Close()
	h := mw(t, l)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := httptest.NewRecorder()
	if n := testing.AllocsPerRun(100, func() { clear(w.Header()); h.ServeHTTP(w, r) }); n != 9 {
		t.Errorf("%v allocations per allowed request; docs/guide/http.md says 9", n)
	}
}

// A 101 Switching Protocols response through the Transport keeps its
// writable body (a WebSocket dial writes to it), and the unit is held
// until it is closed.
func TestTransportUpgrade(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		buf := make([]byte, 4)
		if _, err := io.ReadFull(brw, buf); err == nil {
			conn.Write(buf) // echo
		}
	}))
	defer up.Close()
	sem, _ := counting.New(1)
	defer sem.Close()
	c := &http.Client{Transport: &httplimit.Transport{Base: up.Client().Transport, Limiter: sem}}
	req, _ := http.NewRequest("GET", up.URL, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("101 body %T is not writable", resp.Body)
	}
	if _, err := rw.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(rw, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	host := strings.TrimPrefix(up.URL, "http://")
	if sem.InFlight(host) != 1 {
		t.Fatal("unit not held while the connection is open")
	}
	rw.Close()
	if sem.InFlight(host) != 0 {
		t.Fatal("unit held after close")
	}
}

// With the middleware inside http.TimeoutHandler, a concurrency cap holds
// for as long as the handlers run, past the timeout's 503.
func TestTimeoutHandlerOrder(t *testing.T) {
	sem, _ := counting.New(2)
	defer sem.Close()
	var mu sync.Mutex
	running, most := 0, 0
	stop := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-stop // runs on after the timeout answered
		mu.Lock()
		running--
		mu.Unlock()
	})
	limited := mw(t, sem)(slow)
	var inner sync.WaitGroup // every request's run inside the TimeoutHandler
	inner.Add(16)
	h := http.TimeoutHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer inner.Done()
		limited.ServeHTTP(w, r)
	}), 10*time.Millisecond, "timeout")
	var clients sync.WaitGroup
	for range 16 {
		clients.Go(func() { get(h, "192.0.2.1:1") })
	}
	clients.Wait()
	close(stop)
	inner.Wait()
	if most > 2 {
		t.Fatalf("%d handlers ran at once under a cap of 2", most)
	}
}
