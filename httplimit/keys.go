package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/throttlekit/throttle"
)

// IPKey keys requests by client IP address. IPv6 addresses are grouped by
// their first IPv6Prefix bits (default 64: one customer's subnet is one
// key), and IPv4-mapped addresses count as IPv4.
//
// With no Trusted prefixes the key is the connection's remote address, and
// forwarding headers are never read: a client could write any address into
// them. When the remote address is one of the Trusted proxies, the key is
// the rightmost address in the Forwarded (RFC 7239) field, or else in
// X-Forwarded-For, that is not itself a trusted proxy: the address the
// nearest trusted proxy saw.
type IPKey struct {
	Trusted    []netip.Prefix
	IPv6Prefix int
}

// maxHops bounds how many forwarding hops are read, from the right.
const maxHops = 32

// RemoteIP keys requests by the connection's remote address, IPv6 grouped
// by /64.
func RemoteIP() KeyFunc { return IPKey{}.Key }

// ClientIP keys requests by the client address behind the trusted
// proxies (see IPKey), IPv6 grouped by /64.
func ClientIP(trusted ...netip.Prefix) KeyFunc { return IPKey{Trusted: trusted}.Key }

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

// Key returns the key of r, or an error wrapping throttle.ErrInvalid when
// no address can be read.
func (k IPKey) Key(r *http.Request) (string, error) {
	remote, err := parseHost(r.RemoteAddr)
	if err != nil {
		return "", fmt.Errorf("%w: httplimit: remote address %q", throttle.ErrInvalid, r.RemoteAddr)
	}
	addr := remote
	if k.trusted(remote) {
		if addr, err = k.forwarded(r, remote); err != nil {
			return "", err
		}
	}
	return k.group(addr), nil
}

func (k IPKey) group(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	bits := k.IPv6Prefix
	if bits <= 0 || bits > 128 {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

func (k IPKey) trusted(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range k.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwarded walks the forwarding hops right to left and returns the first
// one that is not a trusted proxy, the leftmost one if all are, or remote
// when the trusted proxy sent no forwarding field (its own request).
func (k IPKey) forwarded(r *http.Request, remote netip.Addr) (netip.Addr, error) {
	hops, param := r.Header.Values("Forwarded"), true
	if len(hops) == 0 {
		hops, param = r.Header.Values("X-Forwarded-For"), false
	}
	if len(hops) == 0 {
		return remote, nil
	}
	list := strings.Join(hops, ",")
	var last netip.Addr
	for range maxHops {
		i := strings.LastIndexByte(list, ',')
		elem := list[i+1:]
		list = list[:max(i, 0)]
		var a netip.Addr
		var err error
		if param {
			a, err = forwardedFor(elem)
		} else {
			a, err = parseHost(strings.Trim(elem, " \t")) // optional white space, as HTTP defines it
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w: httplimit: forwarded address %q", throttle.ErrInvalid, clip(elem))
		}
		if !k.trusted(a) {
			return a, nil
		}
		last = a
		if i < 0 {
			break
		}
	}
	return last, nil
}

// clip shortens untrusted text quoted in an error.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// forwardedFor returns the address of the for= parameter of one element
// of a Forwarded field.
func forwardedFor(elem string) (netip.Addr, error) {
	for _, pair := range strings.Split(elem, ";") {
		name, value, ok := strings.Cut(strings.Trim(pair, " \t"), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = value[1 : len(value)-1]
		}
		return parseHost(value)
	}
	return netip.Addr{}, fmt.Errorf("no for= parameter")
}

// parseHost reads an address with or without a port: "192.0.2.1",
// "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]:80".
func parseHost(s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), nil
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	return netip.ParseAddr(s)
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
