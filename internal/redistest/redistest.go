// Package redistest starts real redis-server processes for tests: a
// standalone server on a free loopback port, or a Redis Cluster of several
// masters, each killed when the test ends.
//
// Start honours two environment variables:
//
//   - THROTTLE_REDIS_ADDR=host:port uses an existing server instead of
//     starting one (tests that kill or restart the server then skip);
//   - THROTTLE_REQUIRE_REDIS=1 turns "redis-server is not installed" from
//     a skip into a failure, so that CI cannot silently skip.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Start and StartCluster.
const (
	EnvAddr    = "THROTTLE_REDIS_ADDR"
	EnvRequire = "THROTTLE_REQUIRE_REDIS"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is a redis-server used by a test: one this package started, or
// the external server named by THROTTLE_REDIS_ADDR. Its methods are safe
// for concurrent use.
type Server struct {
	// Addr is the server's host:port.
	Addr string

	t     testing.TB
	bin   string
	port  int
	dir   string
	extra []string
	conf  string // a sentinel's configuration file; empty for a server
	// confText is written to conf before every start attempt.
	confText string

	proc testproc.Slot
}

// unavailable skips t, or fails it when THROTTLE_REQUIRE_REDIS=1.
func unavailable(t testing.TB, why string) {
	t.Helper()
	testproc.Unavailable(t, EnvRequire,
		"redis unavailable: "+why+" (install the redis-server package, or set "+EnvAddr+"=host:port)")
}

// Start returns a running standalone server for t: the external one named
// by THROTTLE_REDIS_ADDR if set, otherwise a fresh redis-server on a free
// 127.0.0.1 port with persistence off, killed at the end of the test.
// extra arguments are passed to redis-server. Without a server Start skips
// t (or fails it under THROTTLE_REQUIRE_REDIS=1).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	if addr := os.Getenv(EnvAddr); addr != "" {
		if err := waitPing(addr, 2*time.Second); err != nil {
			t.Fatalf("%s=%s: %v", EnvAddr, addr, err)
		}
		return &Server{Addr: addr, t: t}
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found in PATH")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), extra: extra}
	if err := s.startOnFreePort(0); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// startOnFreePort starts the server on a free port (and port+offset free
// too, with offset > 0), trying again when the port was taken between
// probe and bind.
func (s *Server) startOnFreePort(offset int) error {
	return testproc.Retry(5, func() error {
		port, err := testproc.FreePort(offset)
		if err != nil {
			return err
		}
		s.port, s.Addr = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if s.conf != "" && s.confText != "" {
			// Sentinel rewrites its file: write it afresh for every try.
			if err := os.WriteFile(s.conf, []byte(s.confText), 0o600); err != nil {
				return err
			}
		}
		return s.start()
	})
}

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors master under the given name (quorum 1), killed at the end of
// the test. master must be a server this package started.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	master.NeedOwn(t)
	s := &Server{t: t, bin: master.bin, dir: t.TempDir()}
	s.conf = filepath.Join(s.dir, "sentinel.conf")
	s.confText = fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
		name, master.port, name)
	if err := s.startOnFreePort(0); err != nil {
		t.Fatalf("redistest: sentinel: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// ErrNoServer is returned by StartServer when redis-server is not
// installed and THROTTLE_REDIS_ADDR is not set.
var ErrNoServer = errors.New("redistest: redis unavailable: install the redis-server package, or set " + EnvAddr + "=host:port")

// Required reports whether THROTTLE_REQUIRE_REDIS=1 forbids skipping.
func Required() bool { return testproc.Required(EnvRequire) }

// StartServer is Start outside of a test, for TestMain (and the examples
// it serves): it returns the external server or a fresh redis-server,
// which the caller stops with Close, or ErrNoServer.
func StartServer() (*Server, error) {
	if addr := os.Getenv(EnvAddr); addr != "" {
		if err := waitPing(addr, 2*time.Second); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvAddr, addr, err)
		}
		return &Server{Addr: addr}, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoServer
	}
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	if err := s.startOnFreePort(0); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// External reports whether the server was not started by this package
// (THROTTLE_REDIS_ADDR); such a server cannot be killed or restarted.
func (s *Server) External() bool { return s.bin == "" }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

func (s *Server) args() []string {
	if s.conf != "" {
		return []string{s.conf, "--sentinel", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
			"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning"}
	}
	a := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--protected-mode", "no", "--loglevel", "warning",
	}
	return append(a, s.extra...)
}

// start runs redis-server and waits for PING.
func (s *Server) start() error {
	err := s.proc.Start(exec.Command(s.bin, s.args()...), startTimeout,
		func() error { return Ping(s.Addr, 500*time.Millisecond) })
	if err != nil {
		return fmt.Errorf("redis-server %s: %w", s.Addr, err)
	}
	return nil
}

// Kill stops the server with SIGKILL and waits for it to exit. It is a
// no-op on an external or already stopped server. A killed server can be
// started again on the same port with Restart.
func (s *Server) Kill() { s.proc.Kill() }

// Close kills a server made by StartServer and removes its directory.
func (s *Server) Close() {
	s.Kill()
	if s.bin != "" && s.t == nil && s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// Restart starts a killed server again on the same port, with empty data.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.External() {
		t.Skip("cannot restart the external server " + s.Addr)
	}
	if err := testproc.RetryFor(startTimeout, s.start); err != nil { // the port may linger briefly
		t.Fatalf("redistest: restart: %v", err)
	}
}

// NeedOwn skips t when the server is external: the test wants to kill,
// restart or reconfigure it.
func (s *Server) NeedOwn(t testing.TB) {
	t.Helper()
	if s.External() {
		t.Skip("test needs a redis-server of its own, not the external " + s.Addr)
	}
}

// Ping sends PING to addr and checks for PONG, within timeout.
func Ping(addr string, timeout time.Duration) error {
	_, err := Do(addr, timeout, "PING")
	return err
}

// Do sends one command to addr over a fresh connection and returns the
// reply: a simple string or integer without its type byte, or a bulk
// string. An error reply is
// returned as an error. It is meant for setting servers up, not for the
// code under test.
func Do(addr string, timeout time.Duration, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

func waitPing(addr string, timeout time.Duration) error {
	return testproc.RetryFor(timeout, func() error { return Ping(addr, 500*time.Millisecond) })
}

// Cluster is a Redis Cluster of masters on loopback ports, without
// replicas, torn down at the end of the test.
type Cluster struct {
	// Addrs are the masters' host:port addresses.
	Addrs   []string
	Servers []*Server
}

// StartCluster starts masters redis-server processes in cluster mode and
// joins them with redis-cli --cluster create, waiting until every node
// reports cluster_state:ok. It skips (or fails, see Start) when
// redis-server or redis-cli is missing, and skips with THROTTLE_REDIS_ADDR
// set (an external server is not a cluster).
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if os.Getenv(EnvAddr) != "" && os.Getenv(EnvRequire) != "1" {
		t.Skip("cluster test needs redis-server to be installed; " + EnvAddr + " names a standalone server")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found in PATH")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "redis-cli not found in PATH")
	}
	c := &Cluster{}
	for i := range masters {
		s := &Server{t: t, bin: bin, dir: t.TempDir()}
		s.extra = []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, fmt.Sprintf("nodes-%d.conf", i)),
			"--cluster-node-timeout", "2000",
		}
		if err := s.startOnFreePort(10000); err != nil { // the cluster bus port is port+10000
			t.Fatalf("redistest: cluster node %d: %v", i, err)
		}
		t.Cleanup(s.Kill)
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.Command(cli, args...)
	done := make(chan struct{})
	var out []byte
	var cerr error
	go func() { out, cerr = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("redis-cli --cluster create timed out:\n%s", out)
	}
	if cerr != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", cerr, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range c.Addrs {
		for {
			info, err := Do(a, time.Second, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok: %v\n%s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}
