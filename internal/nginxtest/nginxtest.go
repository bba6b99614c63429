// Package nginxtest runs a real nginx reverse proxy for tests, on a free
// loopback port, from a generated configuration in a temporary directory.
//
// Start honours two environment variables:
//
//   - THROTTLE_NGINX=path names the binary (default: nginx in PATH, else
//     /usr/sbin/nginx);
//   - THROTTLE_REQUIRE_NGINX=1 turns "nginx is not installed" from a skip
//     into a failure, so that CI cannot silently skip.
package nginxtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Start.
const (
	EnvBinary  = "THROTTLE_NGINX"
	EnvRequire = "THROTTLE_REQUIRE_NGINX"
)

func binary() string {
	if bin := os.Getenv(EnvBinary); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("nginx"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	return ""
}

// Start runs nginx proxying every request to upstream (host:port on
// loopback), with location holding the proxy directives (proxy_pass
// included, with the upstream written as $upstream). It returns the
// proxy's base URL; nginx is stopped when t ends. Without nginx, t is
// skipped (failed under THROTTLE_REQUIRE_NGINX=1).
func Start(t testing.TB, upstream, location string) string {
	t.Helper()
	bin := binary()
	if bin == "" {
		testproc.Unavailable(t, EnvRequire,
			"nginx unavailable: no nginx in PATH (install the nginx package, or set "+EnvBinary+"=path)")
	}
	dir := t.TempDir()
	var url string
	var proc *testproc.Proc
	err := testproc.Retry(5, func() error {
		port, err := testproc.FreePort(0)
		if err != nil {
			return err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server {
		listen %[2]s;
		set $upstream %[3]s;
		location / {
			%[4]s
		}
	}
}
`, dir, addr, upstream, location)
		url = "http://" + addr
		proc, err = testproc.Start(exec.Command(bin, "-p", dir, "-c", testproc.WriteFile(t, "nginx.conf", conf)),
			10*time.Second, testproc.Dials("tcp", addr))
		return err
	})
	if err != nil {
		t.Fatalf("nginx: %v", err)
	}
	t.Cleanup(proc.Kill)
	return url
}
