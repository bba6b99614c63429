package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/extra/envoyrls"
	"github.com/throttlekit/throttle/internal/cmdkit"
	"github.com/throttlekit/throttle/internal/gcfloor"
	"github.com/throttlekit/throttle/internal/testproc"
)

func rlsYAML(limit string) string {
	return "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: " + limit + "}\n"
}

// -check loads the envoy section's YAML files, and refuses a bad one
// naming the file and the line; -print-config prints the section.
func TestEnvoyCheckAndPrint(t *testing.T) {
	yaml := testproc.WriteFile(t, "rls.yaml", rlsYAML("2"))
	var out, errb bytes.Buffer
	args := []string{"-check", "-log-level", "warn", "-envoy-grpc", "127.0.0.1:0", "-envoy-config", yaml}
	if err := run(args, &out, &errb); err != nil || !strings.Contains(out.String(), "envoy configuration valid: 1 domain(s), 1 rule(s)") {
		t.Fatalf("-check: %v\n%s%s", err, out.String(), errb.String())
	}
	bad := testproc.WriteFile(t, "bad.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
	err := run([]string{"-check", "-envoy-grpc", "127.0.0.1:0", "-envoy-config", bad}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:4: invalid rate limit unit 'fortnight'") {
		t.Errorf("-check of a bad file: %v", err)
	}
	out.Reset()
	if err := run([]string{"-print-config", "-envoy-grpc", "127.0.0.1:8081", "-envoy-config", yaml}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.ParseConfig(out.Bytes()); err != nil || !strings.Contains(out.String(), `"grpc": "127.0.0.1:8081"`) {
		t.Errorf("printed config: %v\n%s", err, out.String())
	}
	cfg := `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/s","burst":1},"envoy":{"grpc":"127.0.0.1:0","config":"x","bogus":1}}`
	if err := run([]string{"-check", "-config", testproc.WriteFile(t, "c.json", cfg)}, &out, &errb); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown field in the envoy section: %v", err)
	}
}

// throttled serves the RLS API from its envoy section; SIGHUP rereads
// the YAML file, a bad one is refused and the running one kept, and a
// changed section is reported as needing a restart.
func TestEnvoyServesAndReloads(t *testing.T) {
	dir := t.TempDir()
	yaml := filepath.Join(dir, "rls.yaml")
	os.WriteFile(yaml, []byte(rlsYAML("2")), 0o600)
	daemonCfg := func(extra string) string {
		return `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":2},
		"envoy":{"grpc":"127.0.0.1:0","config":"` + yaml + `","watch":"off"` + extra + `}}`
	}
	path := testproc.WriteFile(t, "c.json", daemonCfg(""))
	o := &options{Flags: cmdkit.Flags{ConfigPath: path, LogLevel: "error"}}
	cfg, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	ec, on, err := o.envoySection(&cfg)
	if err != nil || !on {
		t.Fatalf("section: %v %v", on, err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := start(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	envoy, err := startEnvoy(ec, on, srv.Node(), cfg.Gossip, log)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(envoy.srv.Addrs()[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ask := func(user string) *rlsv3.RateLimitResponse {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask("alice").OverallCode; got != want {
			t.Fatalf("request %d: %v, want %v", i, got, want)
		}
	}
	sigs := make(chan os.Signal)
	done := make(chan error, 1)
	go func() { done <- serve(srv, envoy, o, &members{}, log, sigs) }()
	os.WriteFile(yaml, []byte(rlsYAML("5")), 0o600)
	sigs <- syscall.SIGHUP
	testproc.Eventually(t, 5*time.Second, func() bool {
		return ask("bob").Statuses[0].CurrentLimit.RequestsPerUnit == 5
	})
	good := envoy.srv.Service.Config()
	os.WriteFile(yaml, []byte("domain: api\nbogus: 1\n"), 0o600)
	os.WriteFile(path, []byte(daemonCfg(`,"shadow_mode":true`)), 0o600)
	sigs <- syscall.SIGHUP
	sigs <- syscall.SIGTERM
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if envoy.srv.Service.Config() != good {
		t.Fatal("a refused reload replaced the configuration")
	}
	if n := strings.Count(logs.String(), "the envoy section changed"); n != 1 {
		t.Errorf("%d warnings of a changed section, want 1:\n%s", n, logs.String())
	}
}

// The "gossip" backend runs on the daemon's gossip node, and needs one.
func TestEnvoyGossipBackend(t *testing.T) {
	yaml := testproc.WriteFile(t, "rls.yaml", rlsYAML("2"))
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		gossip string
		ok     bool
	}{{``, false}, {`,"gossip":{"listen":"127.0.0.1:0","secret":"0123456789abcdef0123","routing":"owner"}`, true}} {
		path := testproc.WriteFile(t, "c.json", `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":2}`+c.gossip+`,
			"envoy":{"grpc":"127.0.0.1:0","config":"`+yaml+`","watch":"off","backend":"gossip"}}`)
		cfg, ec, on := envoyConfigOf(t, path)
		srv, err := start(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		envoy, err := startEnvoy(ec, on, srv.Node(), cfg.WithDefaults().Gossip, log)
		if (err == nil) != c.ok {
			t.Errorf("gossip %q: %v", c.gossip, err)
		}
		if err == nil {
			resp, err := envoy.srv.Service.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}}}})
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("decide on the gossip backend: %v %v", resp, err)
			}
			envoy.shutdown(context.Background())
		}
		srv.Shutdown(context.Background())
	}
}

// While the Envoy service runs, the collector's goal has its floor
// (unless GOGC is set); once the service is shut down, Go's default is
// back.
func TestEnvoyGCFloor(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: no floor")
	}
	yaml := testproc.WriteFile(t, "rls.yaml", rlsYAML("2"))
	path := testproc.WriteFile(t, "c.json", `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":2},
		"envoy":{"grpc":"127.0.0.1:0","config":"`+yaml+`","watch":"off"}}`)
	cfg, ec, on := envoyConfigOf(t, path)
	envoy, err := startEnvoy(ec, on, nil, cfg.WithDefaults().Gossip, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); gcfloor.Current() == 100; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			envoy.shutdown(context.Background())
			t.Fatal("the service runs with GOGC 100, want a higher percent while the heap is small")
		}
	}
	envoy.shutdown(context.Background())
	if p := gcfloor.Current(); p != 100 {
		t.Errorf("GOGC %d after the service stopped, want 100", p)
	}
}

// envoyConfigOf reads the configuration file at path and its envoy
// section.
func envoyConfigOf(t *testing.T, path string) (daemon.Config, envoyrls.ServerConfig, bool) {
	o := &options{Flags: cmdkit.Flags{ConfigPath: path, LogLevel: "error"}}
	cfg, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	ec, on, err := o.envoySection(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, ec, on
}
