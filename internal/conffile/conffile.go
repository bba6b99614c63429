// Package conffile holds what the daemons' configurations share: strict
// decoding of JSON files (unknown fields, duplicate keys and trailing data
// are errors), address checks, and the error of a bad setting.
//
// Both daemons' configurations follow one pattern: Validate checks and
// never modifies; defaults are filled by one step of their own
// (WithDefaults), which the constructors apply before they check.
package conffile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/throttlekit/throttle"
)

// Invalid returns the error of a bad setting: "config: " and the
// message, wrapping throttle.ErrInvalid.
func Invalid(format string, a ...any) error {
	return fmt.Errorf("%w: config: %s", throttle.ErrInvalid, fmt.Sprintf(format, a...))
}

// CheckAddr checks the host:port addr of the setting name (see
// CheckHostPort); the error, from Invalid, names both.
func CheckAddr(name, addr string, zeroOK bool) error {
	if err := CheckHostPort(addr, zeroOK); err != nil {
		return Invalid("%s %q: %v", name, addr, err)
	}
	return nil
}

// CheckAddrs is CheckAddr, port 0 refused, for each address a list of
// peers holds, and refuses an address listed twice.
func CheckAddrs(name string, addrs []string) error {
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if err := CheckAddr(name, a, false); err != nil {
			return err
		}
		if seen[a] {
			return Invalid("%s %q: listed twice", name, a)
		}
		seen[a] = true
	}
	return nil
}

// Wildcard reports whether the host of hostport is empty or an
// unspecified IP address ("0.0.0.0", "::"): an address to listen on that
// others cannot reach this host by.
func Wildcard(hostport string) bool {
	host, _, _ := net.SplitHostPort(hostport)
	ip := net.ParseIP(host)
	return host == "" || (ip != nil && ip.IsUnspecified())
}

// Decode decodes the JSON object b into v strictly: a key that appears
// twice in an object (which encoding/json would silently resolve to the
// last one), a field v does not have, or data after the object are
// errors.
func Decode(b []byte, v any) error {
	if err := CheckDuplicateKeys(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// CheckHostPort checks "host:port" with a numeric port (in [1, 65535],
// or 0 too if zeroOK, for listeners on a free port).
func CheckHostPort(s string, zeroOK bool) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (p == 0 && !zeroOK) {
		return fmt.Errorf("port %q: want a number in [1, 65535]", port)
	}
	return nil
}

// CheckDuplicateKeys reports a JSON object that has a key twice.
func CheckDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return nil
		}
		switch d {
		case '{':
			keys := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := kt.(string)
				if keys[k] {
					return fmt.Errorf("key %q appears twice in %s", k, path)
				}
				keys[k] = true
				if err := walk(path + "." + k); err != nil {
					return err
				}
			}
		case '[':
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	if err := walk("$"); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
