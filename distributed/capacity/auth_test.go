package capacity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/certtest"
)

// serveMTLS serves h over TLS on loopback, requiring client certificates
// of ca, and returns the address.
func serveMTLS(t *testing.T, ca *certtest.CA, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "server", "")},
		ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestMTLSImpostor: over mutual TLS, a client may act only as the id of
// its certificate: another client's certificate cannot release its lease
// or ask in its name, a caller without a certificate gets nothing, and the
// real client holds its lease throughout.
func TestMTLSImpostor(t *testing.T) {
	ca := certtest.New(t)
	s := laterServer(t, testConfig(100))
	addr := serveMTLS(t, ca, Authenticated(NewHandler(s), CertificateIdentity))
	as := func(cert tls.Certificate, opts ...connect.ClientOption) *HTTPTransport {
		return NewTLSTransport(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}, opts...)
	}
	alice := as(ca.Issue(t, "alice", ""))
	bob := as(ca.Issue(t, "ignored", "spiffe://test/bob"), connect.WithGRPC())

	c := dialClient(t, alice, []string{addr}, WithClientID("alice"))
	r := openResource(t, c, "r", 100)
	for deadline := time.Now().Add(5 * time.Second); r.Capacity() != 100; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("alice's client got no lease over mTLS: %v", c.Err())
		}
	}
	ctx := t.Context()
	if _, err := bob.Release(ctx, addr, &ReleaseRequest{Client: "alice", Resources: []string{"r"}}); !errors.Is(err, ErrForbidden) {
		t.Errorf("bob releasing alice's lease: %v, want ErrForbidden", err)
	}
	if _, err := bob.GetCapacity(ctx, addr, &Request{Client: "alice", Resources: []ResourceRequest{{Resource: "r"}}}); !errors.Is(err, ErrForbidden) {
		t.Errorf("bob asking as alice: %v, want ErrForbidden", err)
	}
	if resp, err := bob.GetCapacity(ctx, addr, &Request{Client: "spiffe://test/bob/band1", Resources: []ResourceRequest{{Resource: "r", Wants: 1}}}); err != nil || resp.Grants[0].Capacity != 0 {
		t.Errorf("bob asking as one of his own ids: %+v, %v", resp, err)
	}
	anon := NewTLSTransport(&tls.Config{RootCAs: ca.Pool})
	if _, err := anon.Release(ctx, addr, &ReleaseRequest{Client: "alice", Resources: []string{"r"}}); !errors.Is(err, throttle.ErrUnavailable) {
		t.Errorf("a caller without a certificate: %v, want the handshake refused", err)
	}
	if h := held(s, "r"); h != 100 {
		t.Errorf("alice's lease: the server counts %v held, want 100", h)
	}
}

// TestBearerTokens: with tokens, a caller acts only as the client its
// token names; without a known token it is unauthenticated.
func TestBearerTokens(t *testing.T) {
	s := laterServer(t, testConfig(100))
	addr := serveLoopback(t, Authenticated(NewHandler(s), BearerTokens(map[string]string{"alice": "token-a", "bob": "token-b"})))
	ctx := t.Context()
	ask := func(tr *HTTPTransport, client string, wants float64) error {
		_, err := tr.GetCapacity(ctx, addr, &Request{Client: client, Resources: []ResourceRequest{{Resource: "r", Wants: wants}}})
		return err
	}
	if err := ask(NewHTTPTransport(nil, WithBearerToken("token-a")), "alice", 100); err != nil {
		t.Fatal(err)
	}
	bob := NewHTTPTransport(nil, WithBearerToken("token-b"), connect.WithProtoJSON())
	if err := ask(bob, "alice", 0); !errors.Is(err, ErrForbidden) {
		t.Errorf("bob as alice: %v, want ErrForbidden", err)
	}
	if _, err := bob.Release(ctx, addr, &ReleaseRequest{Client: "alice", Resources: []string{"r"}}); !errors.Is(err, ErrForbidden) {
		t.Errorf("bob releasing alice's lease: %v, want ErrForbidden", err)
	}
	for _, tr := range []*HTTPTransport{NewHTTPTransport(nil), NewHTTPTransport(nil, WithBearerToken("guess")), NewHTTPTransport(h2cClient(), connect.WithGRPC())} {
		if err := ask(tr, "alice", 0); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("no or a wrong token: %v, want ErrUnauthenticated", err)
		}
	}
	if h := held(s, "r"); h != 100 {
		t.Errorf("alice's lease: the server counts %v held, want 100", h)
	}
}

// Serve a server to clients that authenticate with certificates of a
// CA: each may act only as the client id its certificate names.
func ExampleAuthenticated() {
	s, err := NewServer(Config{Resources: []Template{{ID: "*", Capacity: 100}}}, WithMaxLeases(100_000, 100))
	if err != nil {
		panic(err)
	}
	cert, err := tls.LoadX509KeyPair("server.pem", "server-key.pem")
	if err != nil {
		return // the example has no files
	}
	clientCAs := x509.NewCertPool() // add the CA that issues client certificates
	srv := &http.Server{
		Addr:    "127.0.0.1:7400",
		Handler: Authenticated(NewHandler(s), CertificateIdentity),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert},
			ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert},
		ReadHeaderTimeout: 5 * time.Second,
	}
	_ = srv.ListenAndServeTLS("", "")
}

// A client with a certificate whose identity is its client id.
func ExampleNewTLSTransport() {
	cert, err := tls.LoadX509KeyPair("client.pem", "client-key.pem") // names "worker-1"
	if err != nil {
		return // the example has no files
	}
	roots := x509.NewCertPool() // add the CA that issued the servers' certificates
	t := NewTLSTransport(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}})
	c, err := NewClient(t, []string{"capacity-0.internal:7400", "capacity-1.internal:7400"}, WithClientID("worker-1"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
}
