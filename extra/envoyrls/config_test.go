package envoyrls

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// Every refusal of the reference, and this package's own, names the
// file and the line, and wraps ErrInvalidConfig and throttle.ErrInvalid.
func TestConfigRefusals(t *testing.T) {
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"empty domain", "descriptors: []\n", "f.yaml:1: config file cannot have empty domain"},
		{"empty file", "", "f.yaml:1: config file cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "f.yaml:3: descriptor has empty key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", "f.yaml:5: duplicate descriptor composite key 'd.k_v'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", "f.yaml:5: invalid rate limit unit 'fortnight'"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n", "f.yaml:5: invalid rate limit unit ''"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "f.yaml:4: should not specify rate limit unit when unlimited"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n", "f.yaml:4: config error, unknown key 'ratelimit'"},
		{"unknown nested key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      request_per_unit: 5\n", "f.yaml:6: config error, unknown key 'request_per_unit'"},
		{"non-string key", "domain: d\n1: x\n", "f.yaml:2: config error, key is not of type string"},
		{"list of scalars", "domain: d\ndescriptors:\n  - k\n", "f.yaml:3: config error, yaml file contains list of type other than map"},
		{"float", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", "f.yaml:4: error checking config"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "f.yaml:4: error loading config file: 'requests_per_unit'"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n", "f.yaml:8: should not have an empty replaces entry"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: a\n", "f.yaml:9: replaces should not contain name of same descriptor"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "f.yaml:3: share_threshold can only be used with wildcard values"},
		{"syntax", "domain: d\ndescriptors:\n  - key: k\n   value: [\n", "f.yaml:2: error loading config file: yaml: line 2"},
		{"key twice", "domain: d\ndomain: e\n", "f.yaml:2: config error, key 'domain' given twice"},
		{"bad algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n", "f.yaml:7: unknown algorithm 'leaky'"},
		{"burst without bucket", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 3\n", "f.yaml:7: burst applies to the token_bucket algorithm only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parse([]configFile{{Name: "f.yaml", Data: []byte(c.yaml)}}, LoadOptions{})
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %q, want it to contain %q", err, c.want)
			}
		})
	}
}

// What the reference accepts is accepted: metadata, quota_mode, a
// month or a year, a known key at an unusual level, yes/no booleans.
func TestConfigAcceptsReferenceFiles(t *testing.T) {
	cfg := mustParse(t, "f.yaml", `
domain: d
descriptors:
  - key: k
    metadata: {anything: [1, 2.5, {x: y}]}
    quota_mode: yes
    rate_limit: {unit: MONTH, requests_per_unit: 1}
  - key: y
    rate_limit: {unit: year, requests_per_unit: 4294967295}
  - key: z
    unit: second
`)
	if cfg.Rules() != 2 || len(cfg.Domains()) != 1 {
		t.Errorf("rules %d domains %v", cfg.Rules(), cfg.Domains())
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A directory's files are loaded together (dot files skipped); a domain
// in two files is refused, or merged with MergeDomains, where a key
// given in both is still refused.
func TestConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml":           "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"sub/b.yaml":       "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"c.yaml":           "domain: e\n",
		".hidden.yaml":     "not: valid",
		".git/config.yaml": "broken",
	})
	_, err := Load(dir, LoadOptions{})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "sub/b.yaml:1: duplicate domain 'd'") {
		t.Fatalf("duplicate domain: %v", err)
	}
	cfg, err := Load(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules() != 2 || strings.Join(cfg.Domains(), ",") != "d,e" {
		t.Errorf("merged: %d rules, domains %v", cfg.Rules(), cfg.Domains())
	}
	writeFiles(t, dir, map[string]string{"sub/b.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	if _, err := Load(dir, LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), "sub/b.yaml:3: duplicate descriptor composite key 'd.a'") {
		t.Errorf("merged duplicate key: %v", err)
	}
}

// Reload and Watch put a good version in force and refuse a bad one,
// keeping the configuration in force; Watch acts on a change only once
// it has read the same twice.
func TestSourceReload(t *testing.T) {
	dir := t.TempDir()
	one := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	two := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	writeFiles(t, dir, map[string]string{"a.yaml": one})
	clock := newFakeClock()
	svc, src, err := Open(dir, LoadOptions{}, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	limitOf := func() uint32 {
		resp, err := svc.decide(context.Background(), req("d", desc("k", "x")))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.RequestsPerUnit
	}
	writeFiles(t, dir, map[string]string{"a.yaml": two})
	if err := src.Reload(); err != nil || limitOf() != 2 {
		t.Fatalf("reload: %v, limit %d", err, limitOf())
	}
	writeFiles(t, dir, map[string]string{"b.yaml": "domain: d\nbad: 1\n"})
	if err := src.Reload(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "b.yaml:2") {
		t.Fatalf("bad reload: %v", err)
	}
	if limitOf() != 2 {
		t.Fatal("a refused reload changed the configuration")
	}
	// Watch: a change is acted on at the second look that reads it.
	os.Remove(filepath.Join(dir, "b.yaml"))
	writeFiles(t, dir, map[string]string{"a.yaml": one})
	if err := src.poll(); err != nil || limitOf() != 2 {
		t.Fatalf("first look acted: %v, limit %d", err, limitOf())
	}
	if err := src.poll(); err != nil || limitOf() != 1 {
		t.Fatalf("second look: %v, limit %d", err, limitOf())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Watch(ctx, time.Millisecond) }()
	writeFiles(t, dir, map[string]string{"a.yaml": two})
	for deadline := time.Now().Add(5 * time.Second); limitOf() != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Watch did not reload")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v", err)
	}
}
