package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/certtest"
)

// holdLease opens resource "db" wanting wants on a client with id
// through t, until it holds wants; the client closes with the test.
func holdLease(t *testing.T, tr capacity.Transport, addrs []string, id string, wants float64) (*capacity.Client, *capacity.Resource) {
	t.Helper()
	c, err := capacity.NewClient(tr, addrs, capacity.WithClientID(id), capacity.WithRetry(100*time.Millisecond), capacity.WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r, err := c.Resource("db", wants)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, fmt.Sprintf("%s holds %v", id, wants), func() bool { return r.Capacity() == wants })
	return c, r
}

// TestAuthMTLS: capacityd with TLS and client certificates: a client acts
// only as the id of its certificate (an impostor's release is refused and
// the lease stays), plain HTTP gets nothing, and a leaf authenticates to
// its root with its own certificate and bearer token.
func TestAuthMTLS(t *testing.T) {
	ca := certtest.New(t)
	dir := t.TempDir()
	caFile := ca.WriteCA(t, dir, "ca")
	srvCert, srvKey := certtest.WriteFiles(t, dir, "server", ca.Issue(t, "server", ""))
	leafCert, leafKey := certtest.WriteFiles(t, dir, "leaf", ca.Issue(t, "leaf", ""))
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"leaf": "leaf-token-0123456789"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token.json")
	if err := os.WriteFile(token, []byte(`"leaf-token-0123456789"`), 0o600); err != nil {
		t.Fatal(err)
	}
	root := startTest(t, `{"listen": "127.0.0.1:0", "decrease_grace": "1s",
		"auth": {"cert_file": "`+srvCert+`", "key_file": "`+srvKey+`", "client_ca_file": "`+caFile+`"},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	as := func(cn string) *capacity.HTTPTransport {
		return capacity.NewTLSTransport(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, cn, "")}})
	}
	addr := root.apiLn.Addr().String()
	_, r := holdLease(t, as("alice"), []string{addr}, "alice", 10)
	if _, err := as("bob").Release(t.Context(), addr, &capacity.ReleaseRequest{Client: "alice", Resources: []string{"db"}}); !errors.Is(err, capacity.ErrForbidden) {
		t.Fatalf("bob releasing alice's lease: %v, want ErrForbidden", err)
	}
	if _, err := capacity.NewHTTPTransport(nil).Release(t.Context(), addr, &capacity.ReleaseRequest{Client: "alice", Resources: []string{"db"}}); err == nil {
		t.Fatal("a plain HTTP release went through")
	}
	if l, ok := r.Lease(); !ok || l.Capacity != 10 {
		t.Fatalf("alice's lease after the impostor: %+v %v", l, ok)
	}

	// A root that wants the leaf's certificate and token.
	root2 := startTest(t, `{"listen": "127.0.0.1:0", "decrease_grace": "1s",
		"auth": {"cert_file": "`+srvCert+`", "key_file": "`+srvKey+`", "client_ca_file": "`+caFile+`", "tokens_file": "`+tokens+`"},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	leaf := startTest(t, `{"listen": "127.0.0.1:0", "parent": ["`+root2.apiLn.Addr().String()+`"],
		"parent_auth": {"ca_file": "`+caFile+`", "cert_file": "`+leafCert+`", "key_file": "`+leafKey+`", "token_file": "`+token+`", "client_id": "leaf"},
		"resources": [{"id": "*", "capacity": 1000, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	leafGets(t, leaf, 30)
	if err := leaf.srv.ParentErr(); err != nil {
		t.Fatalf("the root refuses the leaf: %v", err)
	}
}
