// Package etcdtest starts a real etcd server for tests: a single member on
// free loopback ports (client and peer) with its data in a temporary
// directory, killed when the test ends. Tests can kill, pause, resume and
// restart it to see what their code does when etcd fails.
//
// Start honours two environment variables:
//
//   - THROTTLE_ETCD_ENDPOINTS=http://host:port[,...] uses an existing
//     etcd instead of starting one (tests that kill, pause or restart the
//     server then skip);
//   - THROTTLE_REQUIRE_ETCD=1 turns "etcd is not installed" from a skip
//     into a failure, so that CI cannot silently skip.
//
// The package runs the process and speaks plain HTTP to it; it does not
// depend on an etcd client.
package etcdtest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Start.
const (
	EnvEndpoints = "THROTTLE_ETCD_ENDPOINTS"
	EnvRequire   = "THROTTLE_REQUIRE_ETCD"
)

// startTimeout bounds how long etcd may take to report itself healthy.
const startTimeout = 15 * time.Second

// Server is an etcd used by a test: one this package started, or the
// external one named by THROTTLE_ETCD_ENDPOINTS. Its methods are safe for
// concurrent use.
type Server struct {
	// Endpoints are the client URLs (http://127.0.0.1:port).
	Endpoints []string

	bin        string
	dir        string
	clientPort int
	peerPort   int
	name       string // the member's name, "test" when alone
	cluster    string // --initial-cluster, this member alone when ""

	proc testproc.Slot
}

// Start returns a running etcd for t: the external one named by
// THROTTLE_ETCD_ENDPOINTS if set, otherwise a fresh single-member etcd on
// free 127.0.0.1 ports, killed at the end of the test. Without either it
// skips t (or fails it under THROTTLE_REQUIRE_ETCD=1).
func Start(t testing.TB) *Server {
	t.Helper()
	if env := os.Getenv(EnvEndpoints); env != "" {
		s := &Server{Endpoints: strings.Split(env, ",")}
		for _, e := range s.Endpoints {
			if err := waitHealthy(e, 2*time.Second); err != nil {
				t.Fatalf("%s=%s: %v", EnvEndpoints, env, err)
			}
		}
		return s
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testproc.Unavailable(t, EnvRequire,
			"etcd unavailable: etcd not found in PATH (build it from internal/tools/etcd, see CONTRIBUTING, or set "+
				EnvEndpoints+"=http://host:port)")
	}
	s := &Server{bin: bin, dir: t.TempDir()}
	err = testproc.Retry(5, func() error { // a free port may be taken between probe and bind
		ports, err := testproc.FreePorts(2)
		if err != nil {
			return err
		}
		s.clientPort, s.peerPort = ports[0], ports[1]
		s.Endpoints = []string{s.url(s.clientPort)}
		if err := os.RemoveAll(s.dataDir()); err != nil { // a failed try may leave a member behind
			return err
		}
		return s.start()
	})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) url(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }

func (s *Server) dataDir() string { return s.dir + "/data" }

func (s *Server) args() []string {
	peer := s.url(s.peerPort)
	name, cluster := s.name, s.cluster
	if name == "" {
		name, cluster = "test", "test="+peer
	}
	return []string{
		"--name", name,
		"--data-dir", s.dataDir(),
		"--listen-client-urls", s.Endpoints[0],
		"--advertise-client-urls", s.Endpoints[0],
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", cluster,
		"--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn", "--log-outputs", "stderr",
	}
}

// start runs etcd and waits until it reports itself healthy.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args()...)
	// Settings from the environment (ETCD_*) would override the flags.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := s.proc.Start(cmd, startTimeout, s.ready); err != nil {
		return fmt.Errorf("etcd %s: %w", s.Endpoints[0], err)
	}
	return nil
}

// ready reports whether the etcd this Server started answers healthy on
// its client port. A free port can be taken by another test's etcd
// between probe and bind; that one would answer /health too, so the
// member list must name this server's own peer port.
func (s *Server) ready() error {
	e := s.Endpoints[0]
	if err := Healthy(e, time.Second); err != nil {
		return err
	}
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(e+"/v3/cluster/member/list", "application/json", strings.NewReader("{}"))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return err
	}
	if peer := s.url(s.peerPort); !strings.Contains(string(body), `"`+peer+`"`) {
		return fmt.Errorf("etcd at %s is not the one started here (no member with peer %s): %s", e, peer, body)
	}
	return nil
}

// External reports whether the server was not started by this package
// (THROTTLE_ETCD_ENDPOINTS); such a server cannot be killed, paused or
// restarted.
func (s *Server) External() bool { return s.bin == "" }

// NeedOwn skips t when the server is external: the test wants to kill,
// pause or restart it.
func (s *Server) NeedOwn(t testing.TB) {
	t.Helper()
	if s.External() {
		t.Skip("test needs an etcd of its own, not the external " + strings.Join(s.Endpoints, ","))
	}
}

// Kill stops etcd with SIGKILL (paused or not) and waits for it to exit.
// It is a no-op on an external or already stopped server. Restart starts
// it again with its data.
func (s *Server) Kill() { s.proc.Kill() }

// Pause stops etcd with SIGSTOP: its connections stay open but nothing is
// answered, and its clock-driven work (lease expiry) waits until Resume.
func (s *Server) Pause(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Resume continues a paused etcd with SIGCONT.
func (s *Server) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.NeedOwn(t)
	if err := s.proc.Signal(sig); err != nil {
		t.Fatalf("etcdtest: %v: etcd: %v", sig, err)
	}
}

// Restart kills etcd if it runs and starts it again on the same ports
// with the same data (keys, leases and revisions survive, as they do when
// a real member restarts).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.NeedOwn(t)
	s.Kill()
	if err := testproc.RetryFor(startTimeout, s.start); err != nil { // the ports may linger briefly
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Output returns what the etcd process this package started wrote so far
// (its warnings and errors), for failure messages.
func (s *Server) Output() string { return s.proc.Output() }

// Healthy asks the etcd at endpoint (http://host:port) for /health within
// timeout and returns nil when it answers that it is healthy.
func Healthy(endpoint string, timeout time.Duration) error {
	c := http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(strings.TrimSuffix(endpoint, "/") + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd %s not healthy: %s %s", endpoint, resp.Status, body)
	}
	return nil
}

func waitHealthy(endpoint string, timeout time.Duration) error {
	return testproc.RetryFor(timeout, func() error { return Healthy(endpoint, 500*time.Millisecond) })
}
