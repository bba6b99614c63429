package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/testproc"
)

// TestLeaseKeysFile: lease_keys_file is a JSON array of base64 keys of
// 16 bytes or more; with it, grants carry a token that verifies under
// the same keys, and a reload with other keys needs a restart.
func TestLeaseKeysFile(t *testing.T) {
	res := `"resources": [{"id": "*", "capacity": 10}]`
	cfg := func(path string) string {
		return `{"listen": "127.0.0.1:0", "lease_keys_file": "` + path + `", ` + res + `}`
	}
	for _, c := range []struct{ name, file, want string }{
		{"not json", `[`, "want a JSON array of base64 keys"},
		{"not base64", `["!!!"]`, "want a JSON array of base64 keys"},
		{"no key", `[]`, "no key"},
		{"short key", `["c2hvcnQ="]`, "key 0 has 5 bytes"},
	} {
		var out, errb bytes.Buffer
		err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", cfg(testproc.WriteFile(t, "capacityd.json", c.file)))}, &out, &errb)
		if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid containing %q", c.name, err, c.want)
		}
	}
	var out, errb bytes.Buffer
	if err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", cfg("/does/not/exist"))}, &out, &errb); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("missing file: %v", err)
	}

	// Two keys, the second of 16 bytes.
	keys := testproc.WriteFile(t, "capacityd.json", `["`+strings.Repeat("QUJD", 11)+`", "MDEyMzQ1Njc4OWFiY2RlZg=="]`)
	a := startTest(t, cfg(keys))
	resp, err := capacity.NewHTTPTransport(a.hc).GetCapacity(context.Background(), a.apiLn.Addr().String(),
		&capacity.Request{Client: "c", Resources: []capacity.ResourceRequest{{Resource: "r", Wants: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if tok := resp.Grants[0].Token; len(tok) == 0 {
		t.Fatalf("grant without a token: %+v", resp.Grants[0])
	}
	s1, _ := fileConfig{Listen: "127.0.0.1:0", LeaseKeysFile: keys, Resources: []byte(`[{"id": "*", "capacity": 10}]`)}.validate()
	s2, _ := fileConfig{Listen: "127.0.0.1:0", LeaseKeysFile: testproc.WriteFile(t, "capacityd.json", `["MDEyMzQ1Njc4OWFiY2RlZg=="]`), Resources: []byte(`[{"id": "*", "capacity": 10}]`)}.validate()
	if s1 == nil || s2 == nil {
		t.Fatal("valid configurations refused")
	}
	if got := s1.restartNeeded(s2); got != "lease_keys_file" {
		t.Errorf("changed lease keys: restart needed for %q", got)
	}
}
