// Package certtest makes certificates for tests: a CA, and certificates
// it issues for loopback servers and for clients, in memory or as PEM
// files.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA issues certificates valid for an hour around now. Its methods may
// be called concurrently.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// Pool holds the CA's certificate: RootCAs for clients, ClientCAs
	// for servers.
	Pool *x509.CertPool
}

// New returns a new CA; it fails t on error.
func New(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	cert := create(t, tmpl, tmpl, key, key)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, key: key, Pool: pool}
}

// Issue returns a certificate for 127.0.0.1 and ::1, for servers and
// clients, with common name cn and, when not empty, uri as its URI SAN.
func (ca *CA) Issue(t testing.TB, cn, uri string) tls.Certificate {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	cert := create(t, tmpl, ca.Cert, key, ca.key)
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

// WriteFiles writes c to PEM files in dir, named name.pem and
// name-key.pem, and returns their paths.
func WriteFiles(t testing.TB, dir, name string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", c.Certificate[0])
	writePEM(t, keyFile, "PRIVATE KEY", der)
	return certFile, keyFile
}

// WriteCA writes the CA's certificate to dir/name.pem and returns its
// path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name+".pem")
	writePEM(t, p, "CERTIFICATE", ca.Cert.Raw)
	return p
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
