package httplimit_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/internal/nginxtest"
)

// clientFrom returns a client whose connections come from the loopback
// address ip, so that a proxy sees distinct clients.
func clientFrom(t *testing.T, ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// appendForwarded is a reverse proxy's Director that appends a Forwarded
// element naming the peer, as RFC 7239 proxies do.
func appendForwarded(r *http.Request) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	elem := "for=" + host
	if strings.Contains(host, ":") {
		elem = `for="[` + host + `]"`
	}
	if prev := strings.Join(r.Header.Values("Forwarded"), ", "); prev != "" {
		elem = prev + ", " + elem
	}
	r.Header.Set("Forwarded", elem)
}

// TestSpoofingThroughProxies runs the middleware behind real reverse
// proxies (httputil.ReverseProxy, and nginx when installed), each trusted
// for the header it writes, with 5 requests a minute per client. An
// attacker at its limit rotates every forwarding header a client can
// send: it stays at 5, and naming the victim's address costs the victim
// nothing.
func TestSpoofingThroughProxies(t *testing.T) {
	type setup struct {
		name   string
		header string
		proxy  func(t *testing.T, app *url.URL) string // returns the proxy's URL
	}
	goProxy := func(director func(*http.Request)) func(*testing.T, *url.URL) string {
		return func(t *testing.T, app *url.URL) string {
			rp := httputil.NewSingleHostReverseProxy(app)
			if director != nil {
				base := rp.Director
				rp.Director = func(r *http.Request) { base(r); director(r) }
			}
			srv := httptest.NewServer(rp)
			t.Cleanup(srv.Close)
			return srv.URL
		}
	}
	nginx := func(directives string) func(*testing.T, *url.URL) string {
		return func(t *testing.T, app *url.URL) string {
			return nginxtest.Start(t, app.Host, directives+" proxy_pass http://$upstream;")
		}
	}
	for _, s := range []setup{
		// Appends X-Forwarded-For, passes Forwarded through untouched.
		{"ReverseProxy/X-Forwarded-For", "X-Forwarded-For", goProxy(nil)},
		// Appends a Forwarded element (and X-Forwarded-For).
		{"ReverseProxy/Forwarded", "Forwarded", goProxy(appendForwarded)},
		// Stock: appends X-Forwarded-For, passes Forwarded through.
		{"nginx/X-Forwarded-For", "X-Forwarded-For", nginx(`proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`)},
		// Appends a Forwarded element; passes X-Forwarded-For through.
		{"nginx/Forwarded", "Forwarded", nginx(`proxy_set_header Forwarded "$http_forwarded, for=$remote_addr";`)},
		// Sets X-Real-IP, replacing the client's.
		{"nginx/X-Real-IP", "X-Real-IP", nginx(`proxy_set_header X-Real-IP $remote_addr;`)},
	} {
		t.Run(s.name, func(t *testing.T) {
			l, _ := fixedwindow.New(5, time.Minute, frozen())
			defer l.Close()
			app := httptest.NewServer(mw(t, l, httplimit.WithKey(httplimit.ClientIP(httplimit.TrustProxy(s.header, 1))))(ok))
			defer app.Close()
			u, _ := url.Parse(app.URL)
			proxy := s.proxy(t, u)
			attacker, victim := clientFrom(t, "127.0.0.2"), clientFrom(t, "127.0.0.3")
			do := func(c *http.Client, named string) int {
				req, _ := http.NewRequestWithContext(context.Background(), "GET", proxy+"/", nil)
				if named != "" {
					req.Header.Set("Forwarded", "for="+named)
					req.Header.Set("X-Forwarded-For", named)
					req.Header.Set("X-Real-IP", named)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			admitted := 0
			for i := range 40 {
				named := fmt.Sprintf("198.51.100.%d", i)
				if i%4 == 0 {
					named = "127.0.0.3" // the victim
				}
				if do(attacker, named) == http.StatusOK {
					admitted++
				}
			}
			if admitted != 5 {
				t.Errorf("attacker rotating forwarding headers: %d of 40 admitted, want 5", admitted)
			}
			for i := range 5 {
				if code := do(victim, ""); code != http.StatusOK {
					t.Fatalf("victim's request %d: %d after the attacker named its address", i, code)
				}
			}
		})
	}
}
