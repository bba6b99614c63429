// Package clientip finds the address a request is limited under: the
// peer's address, or the one a trusted proxy wrote into the header it
// writes, counted in hops from the right. httplimit and grpclimit share
// it.
package clientip

import (
	"fmt"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/throttlekit/throttle"
)

// Option configures a Config.
type Option func(*Config)

// Config says where a request's client address is read. The zero Config
// reads the peer's address. A Config is immutable once built, and safe
// for concurrent use.
type Config struct {
	header    string // canonical MIME form; "" reads the peer's address
	forwarded bool   // header is Forwarded (RFC 7239): read its for= parameter
	hops      int
	proxies   []netip.Prefix
	v6bits    int
	err       error
}

// TrustProxy reads the client address from header, which each of hops
// trusted proxies in front of the server writes: the hops-th element from
// the right of a list (X-Forwarded-For, Forwarded) or the value of a
// single-value header (X-Real-IP, CF-Connecting-IP) with hops 1.
func TrustProxy(header string, hops int) Option {
	return func(c *Config) {
		if header == "" || hops < 1 {
			c.err = fmt.Errorf("%w: TrustProxy(%q, %d): want a header name and hops >= 1", throttle.ErrInvalid, header, hops)
			return
		}
		c.header = textproto.CanonicalMIMEHeaderKey(header)
		c.forwarded = c.header == "Forwarded"
		c.hops = hops
	}
}

// TrustedProxies reads the header only on requests whose peer is in one
// of prefixes; any other peer is keyed by its own address.
func TrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *Config) {
		for _, p := range prefixes {
			if !p.IsValid() {
				c.err = fmt.Errorf("%w: TrustedProxies: invalid prefix %v", throttle.ErrInvalid, p)
				return
			}
			c.proxies = append(c.proxies, p.Masked())
		}
	}
}

// IPv6Prefix groups IPv6 clients by their first bits bits (default 64:
// one subscriber's network is one key; 128 keys each address).
func IPv6Prefix(bits int) Option {
	return func(c *Config) {
		if bits < 1 || bits > 128 {
			c.err = fmt.Errorf("%w: IPv6Prefix(%d): want 1 to 128", throttle.ErrInvalid, bits)
			return
		}
		c.v6bits = bits
	}
}

// New returns the Config of opts. Errors wrap throttle.ErrInvalid.
func New(opts ...Option) (*Config, error) {
	c := &Config{v6bits: 64}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil client IP option", throttle.ErrInvalid)
		}
		o(c)
		if c.err != nil {
			return nil, c.err
		}
	}
	if len(c.proxies) > 0 && c.header == "" {
		return nil, fmt.Errorf("%w: TrustedProxies without TrustProxy: say which header the proxies write", throttle.ErrInvalid)
	}
	return c, nil
}

// Header returns the header read, in canonical MIME form ("" for none).
func (c *Config) Header() string { return c.header }

// Unknown is the key of a client the trusted proxy states as "unknown".
const Unknown = "unknown"

// Key returns the key of a request from peer (an address with or without
// a port, as http.Request.RemoteAddr) whose header field lines are
// values, in the order received. Errors wrap throttle.ErrInvalid.
func (c *Config) Key(peer string, values []string) (string, error) {
	a, err := ParseHost(peer)
	if err != nil {
		return "", fmt.Errorf("%w: remote address %q", throttle.ErrInvalid, clip(peer))
	}
	return c.KeyAddr(a, values)
}

// KeyAddr is Key for a parsed peer address.
func (c *Config) KeyAddr(peer netip.Addr, values []string) (string, error) {
	if c.fromProxy(peer) {
		if key, ok, err := c.FromHeader(values); ok || err != nil {
			return key, err
		}
	}
	return c.group(peer), nil
}

// FromHeader returns the key the trusted header's field lines values
// state, and true; or false when there is none to read (no header
// trusted, or an empty field). It does not check TrustedProxies: Key and
// KeyAddr do. Errors wrap throttle.ErrInvalid.
func (c *Config) FromHeader(values []string) (string, bool, error) {
	if c.header == "" || len(values) == 0 {
		return "", false, nil
	}
	elem, ok := fromRight(values, c.hops, c.forwarded)
	if !ok && elem == "" {
		return "", false, nil
	}
	node := elem
	if c.forwarded {
		if node, ok = forParam(elem); !ok {
			return Unknown, true, nil // an element without for=: nothing stated
		}
	}
	switch {
	case strings.EqualFold(node, Unknown):
		return Unknown, true, nil
	case obfuscated(node):
		return node, true, nil
	}
	a, err := ParseHost(node)
	if err != nil {
		return "", false, fmt.Errorf("%w: %s address %q", throttle.ErrInvalid, c.header, clip(node))
	}
	return c.group(a), true, nil
}

// Proxied reports whether the header is read only from TrustedProxies.
func (c *Config) Proxied() bool { return len(c.proxies) > 0 }

// Group returns the key of the address a: IPv4 itself, IPv6 its prefix.
func (c *Config) Group(a netip.Addr) string { return c.group(a) }

func (c *Config) fromProxy(a netip.Addr) bool {
	if c.header == "" {
		return false
	}
	if len(c.proxies) == 0 {
		return true
	}
	a = a.Unmap().WithZone("")
	for _, p := range c.proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group returns the key of a: an IPv4 address, or the IPv6 prefix.
func (c *Config) group(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	bits := c.v6bits
	if bits == 0 {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

// fromRight returns the n-th non-empty element from the right of the
// comma-separated list in lines (1-based), and true; or, when the list
// has fewer, its leftmost non-empty element ("" if none) and false. Only
// as many elements as needed are read, from the right, so text a client
// wrote to the left of the proxies' elements (an unclosed quote, say)
// cannot change which element is found. quotes honours quoted strings
// (Forwarded), in which a comma separates nothing.
func fromRight(lines []string, n int, quotes bool) (string, bool) {
	var last string
	seen := 0
	for i := len(lines) - 1; i >= 0; i-- {
		s := lines[i]
		for {
			j := lastComma(s, quotes)
			if e := trimOWS(s[j+1:]); e != "" {
				if seen++; seen == n {
					return e, true
				}
				last = e
			}
			if j < 0 {
				break
			}
			s = s[:j]
		}
	}
	return last, false
}

// lastComma returns the index of the last comma of s outside quoted
// strings, or -1.
func lastComma(s string, quotes bool) int {
	in := false
	for j := len(s) - 1; j >= 0; j-- {
		switch s[j] {
		case ',':
			if !in {
				return j
			}
		case '"':
			if !quotes {
				continue
			}
			if in {
				k := j
				for k > 0 && s[k-1] == '\\' {
					k--
				}
				if (j-k)%2 == 1 {
					continue // an escaped quote
				}
			}
			in = !in
		}
	}
	return -1
}

// forParam returns the node of the for= parameter of one Forwarded
// element, unquoted.
func forParam(elem string) (string, bool) {
	for elem != "" {
		pair := elem
		if j := indexUnquoted(elem, ';'); j >= 0 {
			pair, elem = elem[:j], elem[j+1:]
		} else {
			elem = ""
		}
		name, value, ok := strings.Cut(trimOWS(pair), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = value[1 : len(value)-1]
		}
		return value, true
	}
	return "", false
}

// indexUnquoted returns the index of the first c in s outside quoted
// strings, or -1.
func indexUnquoted(s string, c byte) int {
	in := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if in {
				i++
			}
		case '"':
			in = !in
		case c:
			if !in {
				return i
			}
		}
	}
	return -1
}

// obfuscated reports whether node is an obfuscated identifier of RFC
// 7239 ("_" then letters, digits, '.', '_', '-'), up to 64 bytes.
func obfuscated(node string) bool {
	if len(node) < 2 || len(node) > 64 || node[0] != '_' {
		return false
	}
	for i := 1; i < len(node); i++ {
		switch c := node[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// clip shortens untrusted text quoted in an error.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// ParseHost reads an address with or without a port, IPv6 or IPv4 in
// brackets or not: "192.0.2.1", "192.0.2.1:80", "[192.0.2.1]:80",
// "2001:db8::1", "[2001:db8::1]:80".
func ParseHost(s string) (netip.Addr, error) {
	// No parse is tried that fails on a valid form: a failed netip parse
	// allocates its error.
	switch i := strings.LastIndexByte(s, ':'); {
	case len(s) > 0 && s[0] == '[':
		end := strings.IndexByte(s, ']')
		if end < 0 || !validPort(s[end+1:]) {
			break
		}
		return netip.ParseAddr(s[1:end])
	case i >= 0 && strings.IndexByte(s[:i], ':') < 0: // IPv4 with a port
		if !validPort(s[i:]) {
			break
		}
		return netip.ParseAddr(s[:i])
	default:
		return netip.ParseAddr(s)
	}
	return netip.Addr{}, fmt.Errorf("%w: address %q", throttle.ErrInvalid, clip(s))
}

// validPort reports whether s is empty, or ":" and 1 to 5 digits or an
// obfuscated port (RFC 7239).
func validPort(s string) bool {
	if s == "" {
		return true
	}
	if len(s) > 1 && s[0] == ':' && obfuscated(s[1:]) {
		return true
	}
	if len(s) < 2 || len(s) > 6 || s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
