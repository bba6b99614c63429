package envoyrls

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Start serves the RLS API and gRPC health on its gRPC address, /json
// and /healthcheck on its HTTP one, and Shutdown turns both unhealthy.
func TestServerStart(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"})
	c, err := parseServerConfig([]byte(`{"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "config": "` + filepath.ToSlash(dir) + `", "watch": "off"}`))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Start(c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(srv.Addrs()[0].String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(t.Context(), req("d", desc("k", "v"), desc("k", "v")))
	if err != nil || resp.OverallCode != codeOver || resp.Statuses[0].Code != codeOK {
		t.Fatalf("gRPC: %v %v", resp, err)
	}
	h, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health: %v %v", h, err)
	}
	r, err := http.Post("http://"+srv.Addrs()[1].String()+"/json", "application/json",
		strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"w"}]}]}`))
	code, b := readResponse(t, r, err)
	if code != 200 || !strings.Contains(b, `"limitRemaining":0`) && !strings.Contains(b, `"OK"`) {
		t.Errorf("/json: %d %s", code, b)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ServerConfig{GRPC: "127.0.0.1:0", Config: dir, Backend: "gossip"}, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("gossip backend without a node: %v", err)
	}
	for _, bad := range []string{`{"grpc": "x", "config": "d"}`, `{"grpc": "127.0.0.1:1"}`, `{"grpc": "127.0.0.1:1", "config": "d", "backend": "etcd"}`,
		`{"grpc": "127.0.0.1:1", "config": "d", "backend": "redis"}`, `{"grpc": "127.0.0.1:1", "config": "d", "watch": "-1s"}`, `{"grpc": "127.0.0.1:1", "config": "d", "x": 1}`} {
		if _, err := parseServerConfig([]byte(bad)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
