package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clientip"
)

// IPOption configures ClientIP.
type IPOption = clientip.Option

// TrustProxy makes ClientIP read the client address from header, the
// field the proxies in front of the server write, hops of them, each the
// peer of the next:
//
//   - "X-Forwarded-For": the hops-th address from the right (nginx's
//     $proxy_add_x_forwarded_for and httputil.ReverseProxy append the
//     address they saw). Addresses to the left of it are the client's to
//     write, and are never read.
//   - "Forwarded" (RFC 7239): the for= node of the hops-th element from
//     the right, for a proxy that appends one. Most proxies (nginx,
//     httputil.ReverseProxy) pass a client's Forwarded through untouched:
//     trust it only if yours writes it.
//   - a header the proxy sets to the client's address, replacing what
//     the client sent ("X-Real-IP", "CF-Connecting-IP",
//     "True-Client-IP"), with hops 1.
//
// Empty list elements are skipped. A request without the header is keyed
// by its peer (the proxy's own request); so is one from a peer outside
// TrustedProxies, when given. A node the proxy states as "unknown" is
// keyed "unknown"; an obfuscated one ("_hidden") by itself.
//
// Trust only a header your outermost trusted proxy overwrites or appends
// to, and count exactly the proxies that append: one too many reads an
// address the client wrote.
func TrustProxy(header string, hops int) IPOption { return clientip.TrustProxy(header, hops) }

// TrustedProxies reads the header of TrustProxy only on requests whose
// peer is in one of prefixes (the proxies' addresses), so that a client
// reaching the server directly cannot name an address. Others are keyed
// by their peer.
func TrustedProxies(prefixes ...netip.Prefix) IPOption {
	return clientip.TrustedProxies(prefixes...)
}

// IPv6Prefix groups IPv6 clients by their first bits bits (default 64:
// one subscriber's network is one key, as a client holds a whole /64).
func IPv6Prefix(bits int) IPOption { return clientip.IPv6Prefix(bits) }

// ClientIP keys requests by client IP address: with no options the
// connection's remote address (forwarding headers are never read, as a
// client can write any address into them); behind proxies, the address
// TrustProxy says they write. IPv6 addresses are grouped by /64
// (IPv6Prefix); IPv4-mapped addresses count as IPv4. A request whose
// address cannot be read is refused with an error wrapping
// throttle.ErrInvalid (400).
//
// ClientIP panics on an invalid option (a hops count below 1, an empty
// header name, a prefix length out of range), as regexp.MustCompile does:
// they are constants of the program.
func ClientIP(opts ...IPOption) KeyFunc {
	c, err := clientip.New(opts...)
	if err != nil {
		panic("httplimit: ClientIP: " + err.Error())
	}
	h := c.Header()
	return func(r *http.Request) (string, error) {
		var values []string
		if h != "" {
			values = r.Header[h]
		}
		key, err := c.Key(r.RemoteAddr, values)
		if err != nil {
			return "", fmt.Errorf("httplimit: %w", err)
		}
		return key, nil
	}
}

// Header keys requests by the value of the named header, such as an API
// key. A request without it is refused with an error wrapping
// throttle.ErrInvalid.
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: httplimit: no %s header", throttle.ErrInvalid, name)
	}
}

type costKey struct{}

// WithRequestCost returns a copy of ctx stating that its request costs n
// units, for a middleware whose cost is CostFromContext: a handler that
// runs before it and knows the cost (a batch's size, a query's rows) says
// so.
func WithRequestCost(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, costKey{}, n)
}

// CostFromContext returns a cost func for WithCost: the cost
// WithRequestCost put in the request's context, else def.
func CostFromContext(def int) func(*http.Request) int {
	return func(r *http.Request) int {
		if n, ok := r.Context().Value(costKey{}).(int); ok {
			return n
		}
		return def
	}
}

type limitKey struct{}

// requestLimit is the limit WithRequestLimit states.
type requestLimit struct {
	rate  throttle.Rate
	burst int
}

func (l *requestLimit) quota() throttle.Quota {
	return throttle.Quota{Limit: l.burst, Window: l.rate.Duration(int64(l.burst))}
}

// WithRequestLimit returns a copy of ctx stating the limit of its
// request, a bucket of burst refilled at rate, for a middleware given
// WithLimitFromContext: a handler that runs before it and knows the
// caller (its plan, say) chooses the limit without a rules document.
func WithRequestLimit(ctx context.Context, rate throttle.Rate, burst int) context.Context {
	return context.WithValue(ctx, limitKey{}, &requestLimit{rate: rate, burst: burst})
}

type decisionKey struct{}

func withDecision(ctx context.Context, d throttle.Decision) context.Context {
	return context.WithValue(ctx, decisionKey{}, d)
}

// DecisionFrom returns the Decision of a denied request, inside the
// handler given to WithDeniedHandler.
func DecisionFrom(r *http.Request) (throttle.Decision, bool) {
	d, ok := r.Context().Value(decisionKey{}).(throttle.Decision)
	return d, ok
}
