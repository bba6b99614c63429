package main

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/throttlekit/throttle"
)

// Any file either fails with an error wrapping throttle.ErrInvalid or
// validates; a valid one prints (-print-config) to a file that parses
// back to the same settings. Never a panic.
func FuzzConfig(f *testing.F) {
	f.Add(string(defaultJSON))
	f.Add(testConfig)
	f.Add(`{"listen": "0.0.0.0:7400", "advertise": "10.0.0.1:7400", "etcd": {"endpoints": ["127.0.0.1:2379"], "ttl": "5s"}, "resources": [{"id": "*", "capacity": 1}]}`)
	f.Add(`{"listen": "127.0.0.1:1", "resources": [{"id": "a/*", "capacity": 1e308}, {"id": "*", "capacity": 0, "algorithm": "static"}]}`)
	f.Fuzz(func(t *testing.T, data string) {
		fc, err := parseFile([]byte(data))
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("parse error %v does not wrap ErrInvalid", err)
			}
			return
		}
		s, err := fc.validate()
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("validation error %v does not wrap ErrInvalid", err)
			}
			return
		}
		printed, err := json.Marshal(s.file)
		if err != nil {
			t.Fatal(err)
		}
		fc2, err := parseFile(printed)
		if err != nil {
			t.Fatalf("printed config %s does not parse: %v", printed, err)
		}
		s2, err := fc2.validate()
		if err != nil {
			t.Fatalf("printed config %s does not validate: %v", printed, err)
		}
		if s2.restartNeeded(s) != "" || len(s2.resources.Resources) != len(s.resources.Resources) || s2.ttl != s.ttl {
			t.Fatalf("round trip changed the settings: %s", printed)
		}
		if _, err := newCapacityServer(s); err != nil {
			t.Fatalf("valid config refused by the server: %v", err)
		}
	})
}
