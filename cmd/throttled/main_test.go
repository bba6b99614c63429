package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) != "" {
		if path := os.Getenv(cpuProfileEnv); path != "" {
			go profileCPU(path)
		}
		main() // the real daemon, for the tests of proc_test.go
		return
	}
	if s := os.Getenv(loadGenEnv); s != "" {
		if err := loadGen(s); err != nil { // for TestGossipScale
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	goleak.VerifyTestMain(m)
}

func TestSelfCheck(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run([]string{"-check", "-log-level", "warn"}, &out, &errb); err != nil {
		t.Fatalf("-check: %v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "self-test passed") || !strings.Contains(out.String(), "served 20 queries") {
		t.Fatalf("output %q", out.String())
	}
}

func TestPrintConfigAndOverrides(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(cfgPath, []byte(`{"listen":["unix:/tmp/x.sock"],"default":{"rate":"5/s","burst":7},
		"gossip":{"listen":"127.0.0.1:7946","peers":["127.0.0.1:7947"],"secret":"0123456789abcdef"}}`), 0o600)
	var out, errb bytes.Buffer
	err := run([]string{"-config", cfgPath, "-burst", "9", "-peers", "a:1,b:2", "-print-config"}, &out, &errb)
	if err != nil {
		t.Fatal(err, errb.String())
	}
	var got struct {
		Default struct {
			Rate  string
			Burst int
		}
		Gossip struct {
			Peers  []string
			Secret string
		}
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Default.Rate != "5/s" || got.Default.Burst != 9 || len(got.Gossip.Peers) != 2 || got.Gossip.Secret != "(redacted)" {
		t.Fatalf("effective config %+v", got)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-rate", "fast", "-print-config"}, {"-config", "/does/not/exist"}, {"-log-level", "loud"}} {
		var out, errb bytes.Buffer
		if err := run(args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
