package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/conffile"
)

// authConfig secures the API port: TLS, and who may act as which client.
// The admin port stays plain HTTP, without authentication: keep it on a
// trusted network (loopback by default).
type authConfig struct {
	// CertFile and KeyFile are the API's certificate and key (PEM); with
	// them the API serves HTTPS only (HTTP/2 and HTTP/1.1).
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile holds the CAs (PEM) whose client certificates the API
	// requires; a request may then act only as the client id its
	// certificate names (its URI SAN, else its common name), or one
	// below it ("id/...").
	ClientCAFile string `json:"client_ca_file,omitempty"`
	// TokensFile is a JSON object of client ids and their bearer tokens;
	// a request must then carry the token of the client it acts as (or
	// one above it). With a client CA too, the token and the certificate
	// must name the same client.
	TokensFile string `json:"tokens_file,omitempty"`
}

// parentAuthConfig is how a server in a tree authenticates to its parent.
type parentAuthConfig struct {
	// CAFile holds the CAs (PEM) that issued the parent's certificate:
	// the parent is called over HTTPS.
	CAFile string `json:"ca_file"`
	// CertFile and KeyFile are this server's client certificate and key
	// (PEM), if the parent requires one.
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// TokenFile holds this server's bearer token at the parent.
	TokenFile string `json:"token_file,omitempty"`
	// ClientID is this server's client id at the parent: the identity of
	// its certificate or token (default "capacityd " and its advertised
	// address).
	ClientID string `json:"client_id,omitempty"`
}

// apiAuth is a loaded authConfig: nil fields are off.
type apiAuth struct {
	tls  *tls.Config
	auth capacity.Authenticator
}

// load reads the files of c (nil: plain HTTP, no authentication).
func (c *authConfig) load() (apiAuth, error) {
	if c == nil {
		return apiAuth{}, nil
	}
	if c.CertFile == "" || c.KeyFile == "" {
		return apiAuth{}, conffile.Invalid("auth: cert_file and key_file are required (tokens and client certificates need TLS)")
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return apiAuth{}, conffile.Invalid("auth: %v", err)
	}
	a := apiAuth{tls: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}}
	var auths []capacity.Authenticator
	if c.ClientCAFile != "" {
		pool, err := loadPool(c.ClientCAFile)
		if err != nil {
			return apiAuth{}, err
		}
		a.tls.ClientCAs, a.tls.ClientAuth = pool, tls.RequireAndVerifyClientCert
		auths = append(auths, capacity.CertificateIdentity)
	}
	if c.TokensFile != "" {
		b, err := os.ReadFile(c.TokensFile)
		if err != nil {
			return apiAuth{}, conffile.Invalid("auth: %v", err)
		}
		var tokens map[string]string
		if err := conffile.Decode(b, &tokens); err != nil {
			return apiAuth{}, conffile.Invalid("auth: tokens_file: %v", err)
		}
		for id, tok := range tokens {
			if id == "" || len(tok) < 16 {
				return apiAuth{}, conffile.Invalid("auth: tokens_file: client %q: ids must not be empty and tokens must have 16 bytes or more", id)
			}
		}
		auths = append(auths, capacity.BearerTokens(tokens))
	}
	switch len(auths) {
	case 1:
		a.auth = auths[0]
	case 2:
		a.auth = func(r *http.Request) (string, error) {
			id, err := auths[0](r)
			if err != nil {
				return "", err
			}
			tid, err := auths[1](r)
			if err == nil && tid != id {
				err = capacity.ErrUnauthenticated
			}
			return id, err
		}
	}
	return a, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, conffile.Invalid("auth: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, conffile.Invalid("auth: %s holds no PEM certificate", path)
	}
	return pool, nil
}

// transport returns the transport to the parent, and the client id to use
// there ("" for the default).
func (c *parentAuthConfig) transport() (capacity.Transport, string, error) {
	if c == nil {
		return capacity.NewHTTPTransport(nil), "", nil
	}
	pool, err := loadPool(c.CAFile)
	if err != nil {
		return nil, "", err
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, "", conffile.Invalid("parent_auth: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	var opts []connect.ClientOption
	if c.TokenFile != "" {
		var tok string
		b, err := os.ReadFile(c.TokenFile)
		if err == nil {
			err = json.Unmarshal(b, &tok)
		}
		if err != nil || tok == "" {
			return nil, "", conffile.Invalid("parent_auth: token_file must hold a JSON string: %v", err)
		}
		opts = append(opts, capacity.WithBearerToken(tok))
	}
	return capacity.NewTLSTransport(cfg, opts...), c.ClientID, nil
}
