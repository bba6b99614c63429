package capacity

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// serveLoopback serves h on 127.0.0.1 with HTTP/1.1 and cleartext HTTP/2
// and returns the address; the server stops at the end of the test.
func serveLoopback(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// h2cClient speaks cleartext HTTP/2 only, as gRPC needs.
func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 10 * time.Second}
}

func warmWireServer(t testing.TB, capacity float64) (*Server, string) {
	t.Helper()
	s := laterServer(t, testConfig(capacity))
	return s, serveLoopback(t, NewHandler(s))
}

// laterServer returns a server on a clock an hour after its start: past
// learning, and no lease expires during a test.
func laterServer(t testing.TB, cfg Config, opts ...ServerOption) *Server {
	t.Helper()
	clk := throttletest.NewClock()
	s, err := NewServer(cfg, append(opts, WithServerClock(clk))...)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	return s
}

func TestWireProtocols(t *testing.T) {
	s, addr := warmWireServer(t, 100)
	for name, tr := range map[string]*HTTPTransport{
		"connect": NewHTTPTransport(&http.Client{Timeout: 10 * time.Second}),
		"json":    NewHTTPTransport(&http.Client{Timeout: 10 * time.Second}, connect.WithProtoJSON()),
		"grpc":    NewHTTPTransport(h2cClient(), connect.WithGRPC()),
		"grpcweb": NewHTTPTransport(&http.Client{Timeout: 10 * time.Second}, connect.WithGRPCWeb()),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			resp, err := tr.GetCapacity(ctx, addr, &Request{Client: name, Resources: []ResourceRequest{{Resource: "r", Wants: 10, Weight: 2}, {Resource: "other", Wants: 3}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Grants) != 2 || resp.Grants[0].Capacity != 10 || resp.Grants[0].Lease != 20*time.Second || resp.Grants[1].Capacity != 3 || resp.Grants[0].Refresh <= 0 {
				t.Fatalf("response %+v", resp)
			}
			// One bad resource is refused alone.
			resp, err = tr.GetCapacity(ctx, addr, &Request{Client: name, Resources: []ResourceRequest{{Resource: "r", Wants: -1}, {Resource: "other", Wants: 3}}})
			if err != nil || !errors.Is(resp.Grants[0].Err, ErrResourceRefused) || !errors.Is(resp.Grants[0].Err, throttle.ErrInvalid) || resp.Grants[1].Err != nil || resp.Grants[1].Capacity != 3 {
				t.Fatalf("bad wants: %+v, %v", resp, err)
			}
			if _, err := tr.Release(ctx, addr, &ReleaseRequest{Client: name, Resources: []string{"r", "other"}}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if st := s.Status(); st.Resources[0].Clients != 0 {
		t.Fatalf("releases lost: %+v", st)
	}
}

func TestWireCurlJSON(t *testing.T) {
	_, addr := warmWireServer(t, 100)
	post := func(method, body string) (int, map[string]any) {
		resp, err := http.Post("http://"+addr+"/throttle.capacity.v1.CapacityService/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	code, m := post("GetCapacity", `{"clientId":"c1","resources":[{"resourceId":"r","wants":10}]}`)
	if code != 200 {
		t.Fatalf("status %d: %v", code, m)
	}
	g := m["grants"].([]any)[0].(map[string]any)
	if g["capacity"] != 10.0 || g["lease"] != "20s" {
		t.Fatalf("grant %v", g)
	}
	if code, m := post("GetStatus", `{}`); code != 200 || m["isMaster"] != true {
		t.Fatalf("status %d %v", code, m)
	}
	for body, want := range map[string]string{
		`{"clientId":"","resources":[{"resourceId":"r","wants":1}]}`: "invalid_argument",
		`{"clientId":`: "invalid_argument",
	} {
		if code, m := post("GetCapacity", body); code != 400 || m["code"] != want {
			t.Errorf("%s: status %d %v, want %s", body, code, m, want)
		}
	}
	// A bad resource is refused in its grant; the others are served.
	for _, bad := range []string{`{"resourceId":"r","wants":"NaN"}`, `{"resourceId":"r","wants":"Infinity"}`, `{"resourceId":"r","wants":-1}`, `{"resourceId":"","wants":1}`} {
		body := `{"clientId":"c","resources":[` + bad + `,{"resourceId":"s","wants":1}]}`
		code, m := post("GetCapacity", body)
		gs, _ := m["grants"].([]any)
		if code != 200 || len(gs) != 2 {
			t.Errorf("%s: status %d %v", body, code, m)
			continue
		}
		g0, g1 := gs[0].(map[string]any), gs[1].(map[string]any)
		if g0["code"] != "RESOURCE_CODE_INVALID_ARGUMENT" || g0["error"] == nil || g1["code"] != nil || g1["lease"] == nil {
			t.Errorf("%s: grants %v", body, gs)
		}
	}
	big := `{"clientId":"c","resources":[{"resourceId":"` + strings.Repeat("x", 3*MaxRequestBytes) + `","wants":1}]}`
	if code, _ := post("GetCapacity", big); code == 200 {
		t.Error("oversized request accepted")
	}
}

func TestWireExhausted(t *testing.T) {
	s := laterServer(t, testConfig(100), WithMaxClients(1), WithMaxResources(1))
	addr := serveLoopback(t, NewHandler(s))
	tr := NewHTTPTransport(nil)
	req := func(c string) *Request {
		return &Request{Client: c, Resources: []ResourceRequest{{Resource: "r", Wants: 1}}}
	}
	if _, err := tr.GetCapacity(context.Background(), addr, req("a")); err != nil {
		t.Fatal(err)
	}
	if resp, err := tr.GetCapacity(context.Background(), addr, req("b")); err != nil || !errors.Is(resp.Grants[0].Err, ErrExhausted) || !errors.Is(resp.Grants[0].Err, ErrResourceRefused) {
		t.Fatalf("resource at its bound of clients: %+v, %v", resp, err)
	}
	// A new resource on a full server: the whole request is refused.
	if _, err := tr.GetCapacity(context.Background(), addr, &Request{Client: "a", Resources: []ResourceRequest{{Resource: "new", Wants: 1}}}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("full server: %v", err)
	}
	if _, err := tr.GetCapacity(context.Background(), "127.0.0.1:1", req("b")); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("no server: %v", err)
	}
}

// TestWireClient runs a Client over the wire against two replicas, one
// of which redirects to the other.
func TestWireClient(t *testing.T) {
	master, addr := warmWireServer(t, 100)
	follower, err := NewServer(testConfig(100))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(done)
		follower.Run(ctx, fakeElection{ls: []Leadership{{Master: addr, Term: 1}}, reported: reported}, "follower")
	}()
	<-reported
	defer func() { cancel(); <-done }()
	faddr := serveLoopback(t, NewHandler(follower))
	c, err := NewClient(NewHTTPTransport(h2cClient(), connect.WithGRPC()), []string{faddr}, WithClientID("w"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Rate("r", 42)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-r.Changes():
		if v != 42 {
			t.Fatalf("capacity %v", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no lease over the wire")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st := master.Status(); st.Resources[0].Clients != 0 {
		t.Fatalf("not released: %+v", st.Resources[0])
	}
}

func FuzzHandler(f *testing.F) {
	f.Add([]byte(`{"clientId":"c1","resources":[{"resourceId":"r","wants":10}]}`), true)
	f.Add([]byte(`{"clientId":"c1","resources":[{"resourceId":"r","wants":1e308,"has":1e308,"weight":1e300,"priority":-7}]}`), true)
	f.Add([]byte{0x0a, 0x02, 'c', '1', 0x12, 0x05, 0x0a, 0x01, 'r', 0x11}, false)
	s := laterServer(f, testConfig(100), WithMaxClients(50), WithMaxResources(20))
	h := NewHandler(s)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		ct := "application/proto"
		if asJSON {
			ct = "application/json"
		}
		req, _ := http.NewRequest("POST", "/throttle.capacity.v1.CapacityService/GetCapacity", bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		w := &recorder{h: http.Header{}}
		h.ServeHTTP(w, req)
		if w.code != 0 && w.code != 200 && w.code != 400 && w.code != 429 && w.code != 415 {
			t.Fatalf("status %d: %s", w.code, w.body.String())
		}
		for _, r := range s.Status().Resources {
			if r.Held > r.Capacity {
				t.Fatalf("held %v > capacity %v", r.Held, r.Capacity)
			}
		}
	})
}

type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(c int)           { r.code = c }

var _ io.Writer = (*recorder)(nil)

const getCapacityPath = "/throttle.capacity.v1.CapacityService/GetCapacity"

// TestWireGzipBomb: a small gzip body that would inflate to 8 MiB is
// refused with errTooLarge after inflating about MaxRequestBytes, not after
// inflating all of it: the bomb's checksum is wrong, which only a handler
// that inflated it to the end would find.
func TestWireGzipBomb(t *testing.T) {
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestSpeed)
	zw.Write(make([]byte, 8*MaxRequestBytes))
	zw.Close()
	b := bomb.Bytes()
	b[len(b)-8] ^= 0xff // the CRC-32 of the trailer
	for _, ct := range []string{"application/json", "application/proto"} {
		t.Run(ct, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, getCapacityPath, bytes.NewReader(b))
			req.Header.Set("Content-Type", ct)
			req.Header.Set("Content-Encoding", "gzip")
			rec := httptest.NewRecorder()
			NewHandler(laterServer(t, testConfig(100))).ServeHTTP(rec, req)
			if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "larger than") {
				t.Errorf("%d-byte bomb: answer %d %s, want 400 request too large", len(b), rec.Code, rec.Body)
			}
		})
	}
}

// TestWireOversized: an oversized body gets a size error, not the code of
// a full server: 413 at once when its length is known, InvalidArgument
// naming the bound otherwise (also over gRPC).
func TestWireOversized(t *testing.T) {
	_, addr := warmWireServer(t, 100)
	big := bytes.Repeat([]byte(" "), 2*MaxRequestBytes)
	resp, err := http.Post("http://"+addr+getCapacityPath, "application/json", bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "larger than") {
		t.Errorf("with a length: %d %s, want 413", resp.StatusCode, body)
	}
	// No length: the body is streamed (chunked).
	resp, err = http.Post("http://"+addr+getCapacityPath, "application/json", io.MultiReader(bytes.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "larger than") {
		t.Errorf("streamed: %d %s, want 400 request too large", resp.StatusCode, body)
	}
	// gRPC, through the transport: the id is far too long, and so is the
	// request.
	tr := NewHTTPTransport(h2cClient(), connect.WithGRPC())
	_, err = tr.GetCapacity(context.Background(), addr, &Request{Client: strings.Repeat("x", 2*MaxRequestBytes), Resources: []ResourceRequest{{Resource: "r", Wants: 1}}})
	if !(errors.Is(err, throttle.ErrInvalid) && strings.Contains(err.Error(), "larger than")) {
		t.Errorf("gRPC: %v, want a request too large", err)
	}
}

// TestWireResourceRefused: over gRPC on loopback HTTP/2, a Client whose
// request holds a resource the server refuses (at its bound of clients)
// gets the other resources, and sees the refusal on that resource alone.
func TestWireResourceRefused(t *testing.T) {
	s := laterServer(t, testConfig(100), WithMaxClients(1))
	addr := serveLoopback(t, NewHandler(s))
	if _, err := s.GetCapacity(context.Background(), &Request{Client: "first", Resources: []ResourceRequest{{Resource: "r", Wants: 1}}}); err != nil {
		t.Fatal(err)
	}
	c := dialClient(t, NewHTTPTransport(h2cClient(), connect.WithGRPC()), []string{addr}, WithClientID("b"))
	full := openResource(t, c, "r", 10)
	other := openResource(t, c, "other", 3)
	deadline := time.Now().Add(10 * time.Second)
	for _, leased := other.Lease(); (full.Err() == nil || !leased) && time.Now().Before(deadline); _, leased = other.Lease() {
		time.Sleep(10 * time.Millisecond)
	}
	if err := full.Err(); !errors.Is(err, ErrResourceRefused) || !errors.Is(err, ErrExhausted) {
		t.Fatalf("refused resource: Err %v", err)
	}
	if l, ok := other.Lease(); !ok || l.Capacity != 3 || other.Err() != nil || c.Err() != nil {
		t.Fatalf("other resource: %+v %v, errs %v %v", l, ok, other.Err(), c.Err())
	}
	if _, ok := full.Lease(); ok {
		t.Fatal("the refused resource has a lease")
	}
}

// TestWireLeaseTokenAndStale: over gRPC on loopback HTTP/2, a lease
// token granted by one replica proves the lease to the next master while
// it learns, and a call older than one applied is answered stale.
func TestWireLeaseTokenAndStale(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 32)
	clk := throttletest.NewClock()
	replica := func() string {
		s, err := NewServer(testConfig(100), WithLeaseKeys(key), WithServerClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		return serveLoopback(t, NewHandler(s))
	}
	issuer := replica()
	clk.Advance(time.Hour) // past learning
	learner := replica()   // a new master: learning
	tr := NewHTTPTransport(h2cClient(), connect.WithGRPC())
	ctx := context.Background()
	get := func(addr string, seq uint64, rr ResourceRequest) *Response {
		t.Helper()
		rr.Resource = "r"
		resp, err := tr.GetCapacity(ctx, addr, &Request{Client: "a", Incarnation: 5, Sequence: seq, Resources: []ResourceRequest{rr}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	g := get(issuer, 9, ResourceRequest{Wants: 30}).Grants[0]
	if g.Capacity != 30 || len(g.Token) != tokenLen {
		t.Fatalf("grant %+v", g)
	}
	if r := get(issuer, 8, ResourceRequest{Wants: 1}); !r.Stale || r.Incarnation != 5 || len(r.Grants) != 0 {
		t.Fatalf("older call: %+v, want stale", r)
	}
	if c := get(learner, 10, ResourceRequest{Wants: 100, Has: 30, Token: g.Token}).Grants[0].Capacity; c != 30 {
		t.Fatalf("learner confirmed %v of the 30 the token proves", c)
	}
	if c := get(learner, 11, ResourceRequest{Wants: 100, Has: 100}).Grants[0].Capacity; c != 0 {
		t.Fatalf("learner confirmed %v without a token", c)
	}
}
