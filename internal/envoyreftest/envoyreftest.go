// Package envoyreftest runs the reference Envoy rate-limit service,
// envoyproxy/ratelimit, for the tests and benchmarks that compare
// extra/envoyrls with it: a built binary named by THROTTLE_ENVOY_RLS_BIN,
// or a checkout named by THROTTLE_ENVOY_RLS_SRC that it builds. Without
// either the test skips, or fails when THROTTLE_REQUIRE_ENVOY_RLS=1.
package envoyreftest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Binary.
const (
	EnvBin     = "THROTTLE_ENVOY_RLS_BIN"
	EnvSrc     = "THROTTLE_ENVOY_RLS_SRC"
	EnvRequire = "THROTTLE_REQUIRE_ENVOY_RLS"
)

// Binary returns the reference's binary: EnvBin's, or one built from
// EnvSrc's checkout into a directory of t's.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(EnvBin); bin != "" {
		return bin
	}
	src := os.Getenv(EnvSrc)
	if src == "" {
		testproc.Unavailable(t, EnvRequire, "the reference rate-limit service is absent: set "+EnvBin+
			" to an envoyproxy/ratelimit binary, or "+EnvSrc+" to a checkout of it")
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	cmd := exec.Command("go", "build", "-o", bin, "./src/service_cmd")
	cmd.Dir, cmd.Env = src, append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the reference in %s: %v\n%s", src, err, out)
	}
	return bin
}

// Start runs bin on free loopback ports with the YAML configuration
// yaml, counting in the Redis at redisAddr under the key prefix "ref_",
// with env added to its environment (the reference's settings, such as
// "LIMIT_RESPONSE_HEADERS_ENABLED=true"), and returns the address of its
// gRPC listener once it accepts connections. The process is killed when
// t ends.
func Start(t testing.TB, bin, yaml, redisAddr string, env ...string) string {
	t.Helper()
	addr, _ := StartProc(t, bin, yaml, redisAddr, env...)
	return addr
}

// StartProc is Start, also returning the process (for a benchmark that
// measures its CPU time).
func StartProc(t testing.TB, bin, yaml, redisAddr string, env ...string) (string, *testproc.Proc) {
	t.Helper()
	root := t.TempDir()
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	ports, err := testproc.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "CACHE_KEY_PREFIX=ref_",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"GRPC_PORT="+strconv.Itoa(ports[0]), "PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]))
	cmd.Env = append(cmd.Env, env...)
	p, err := testproc.Start(cmd, 30*time.Second, testproc.Dials("tcp", grpcAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return grpcAddr, p
}
