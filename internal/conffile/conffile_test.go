package conffile

import (
	"errors"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
)

func TestDecode(t *testing.T) {
	type inner struct {
		B int `json:"b"`
	}
	type cfg struct {
		A string  `json:"a"`
		L []inner `json:"l"`
	}
	var c cfg
	if err := Decode([]byte(`{"a":"x","l":[{"b":1},{"b":2}]}`), &c); err != nil || c.A != "x" || len(c.L) != 2 {
		t.Fatalf("Decode = %+v, %v", c, err)
	}
	for in, want := range map[string]string{
		`{"a":"x","a":"y"}`:             `key "a" appears twice in $`,
		`{"l":[{"b":1},{"b":1,"b":2}]}`: `key "b" appears twice in $.l[1]`,
		`{"z":1}`:                       `unknown field "z"`,
		`{"a":"x"} {}`:                  `trailing data`,
		`{"a":`:                         `EOF`,
	} {
		if err := Decode([]byte(in), &c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want %q", in, err, want)
		}
	}
}

func TestCheckHostPort(t *testing.T) {
	for in, ok := range map[string]bool{
		"127.0.0.1:80": true, "[::1]:65535": true, "host:0": false, "x": false, "h:65536": false, "h:http": false,
	} {
		if err := CheckHostPort(in, false); (err == nil) != ok {
			t.Errorf("CheckHostPort(%q) = %v", in, err)
		}
	}
	if err := CheckHostPort("127.0.0.1:0", true); err != nil {
		t.Error(err)
	}
}

func TestAddrs(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		ok    bool
	}{
		{nil, true},
		{[]string{"a:1", "b:2"}, true},
		{[]string{"a:1", "a:1"}, false},
		{[]string{"a:0"}, false},
		{[]string{"a"}, false},
	} {
		err := CheckAddrs("peers", c.addrs)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, throttle.ErrInvalid)) {
			t.Errorf("CheckAddrs(%q) = %v, want ok %v (else ErrInvalid)", c.addrs, err, c.ok)
		}
	}
	if err := CheckAddr("listen", "127.0.0.1:0", true); err != nil {
		t.Errorf("listen on port 0: %v", err)
	}
	for hp, want := range map[string]bool{":7946": true, "0.0.0.0:1": true, "[::]:1": true, "10.0.0.1:1": false, "host:1": false} {
		if got := Wildcard(hp); got != want {
			t.Errorf("Wildcard(%q) = %v, want %v", hp, got, want)
		}
	}
}
