package capacity

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// Authentication. A Server trusts what each request says: which client
// it is, what it wants and what it holds. Served without authentication
// (NewHandler alone), anyone who can reach the handler can act as any
// client: release its leases, or ask nothing in its name. Authenticated
// puts a handler behind an Authenticator, so that a request may only act
// for the client id its caller proved: the id itself, or one below it
// ("id/..."; a server in a tree names its priority bands so).
//
// The trust boundary is then the Authenticator's: a client that holds a
// certificate or token can still ask for any resource, want anything and
// claim any lease of its own (within the server's bounds), but cannot
// change another client's.

// ErrUnauthenticated reports a request whose caller proved no identity.
var ErrUnauthenticated = errors.New("capacity: unauthenticated")

// ErrForbidden reports a request for a client id other than the one its
// caller proved.
var ErrForbidden = errors.New("capacity: client id not the caller's")

// An Authenticator returns the client id the caller of r proved it is,
// or an error wrapping ErrUnauthenticated. It is called for every request,
// concurrently.
type Authenticator func(r *http.Request) (string, error)

type identityKey struct{}

// Authenticated returns h (a NewHandler) serving only requests auth
// accepts, each only for its caller's client id (or one below it,
// "id/..."). Others get code Unauthenticated (HTTP 401) or
// PermissionDenied (403) and change nothing. GetStatus is open to every
// authenticated caller.
func Authenticated(h http.Handler, auth Authenticator) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := auth(r)
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized) // gRPC clients read Unauthenticated too
			fmt.Fprintf(w, "{\"code\":\"unauthenticated\",\"message\":%q}\n", err.Error())
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// authorize checks that the caller, if authenticated, may act as client.
func authorize(ctx context.Context, client string) error {
	id, ok := ctx.Value(identityKey{}).(string)
	if !ok || client == id || strings.HasPrefix(client, id+"/") {
		return nil
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%w: %q is authenticated as %q", ErrForbidden, client, id))
}

// CertificateIdentity authenticates a caller by the TLS client
// certificate the server verified (tls.RequireAndVerifyClientCert): its
// first URI SAN, or without one its subject's common name.
func CertificateIdentity(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return "", fmt.Errorf("%w: no verified client certificate", ErrUnauthenticated)
	}
	c := r.TLS.VerifiedChains[0][0]
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String(), nil
	case c.Subject.CommonName != "":
		return c.Subject.CommonName, nil
	}
	return "", fmt.Errorf("%w: the client certificate names no URI or common name", ErrUnauthenticated)
}

// BearerTokens authenticates a caller by the token of its Authorization
// header ("Bearer <token>"): tokens maps each client id to its token.
// Tokens are compared in constant time, by their SHA-256.
func BearerTokens(tokens map[string]string) Authenticator {
	type entry struct {
		sum [sha256.Size]byte
		id  string
	}
	es := make([]entry, 0, len(tokens))
	for id, tok := range tokens {
		es = append(es, entry{sha256.Sum256([]byte(tok)), id})
	}
	return func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			return "", fmt.Errorf("%w: no bearer token", ErrUnauthenticated)
		}
		sum := sha256.Sum256([]byte(tok))
		id, found := "", 0
		for _, e := range es { // every entry, so the time does not say which
			if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
				id, found = e.id, 1
			}
		}
		if found == 0 {
			return "", fmt.Errorf("%w: unknown bearer token", ErrUnauthenticated)
		}
		return id, nil
	}
}

// WithBearerToken makes an HTTPTransport send token as its bearer token
// (to a handler behind Authenticated with BearerTokens). Pass it to
// NewHTTPTransport; send tokens only over TLS.
func WithBearerToken(token string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
}

// WithIdentity returns ctx saying that its caller proved it is client id,
// as Authenticated does for the requests it accepts: WireService's methods
// then act only for id (or one below it, "id/...").
func WithIdentity(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}
