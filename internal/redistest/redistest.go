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
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan struct{}
}

// unavailable skips t, or fails it when THROTTLE_REQUIRE_REDIS=1.
func unavailable(t testing.TB, why string) {
	t.Helper()
	msg := "redis unavailable: " + why + " (install the redis-server package, or set " + EnvAddr + "=host:port)"
	if os.Getenv(EnvRequire) == "1" {
		t.Fatal(msg + "; " + EnvRequire + "=1 forbids skipping")
	}
	t.Skip(msg)
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
	var last error
	for range 5 { // a free port may be taken between probe and bind
		if s.port, err = freePort(false); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if last = s.start(); last == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redistest: %v", last)
	return nil
}

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors master under the given name (quorum 1), killed at the end of
// the test. master must be a server this package started.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	master.NeedOwn(t)
	s := &Server{t: t, bin: master.bin, dir: t.TempDir()}
	s.conf = filepath.Join(s.dir, "sentinel.conf")
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
		name, master.port, name)
	var last error
	for range 5 { // a free port may be taken between probe and bind
		port, err := freePort(false)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		// Sentinel rewrites its file: write it afresh for every try.
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.port, s.Addr = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if last = s.start(); last == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redistest: sentinel: %v", last)
	return nil
}

// ErrNoServer is returned by StartServer when redis-server is not
// installed and THROTTLE_REDIS_ADDR is not set.
var ErrNoServer = errors.New("redistest: redis unavailable: install the redis-server package, or set " + EnvAddr + "=host:port")

// Required reports whether THROTTLE_REQUIRE_REDIS=1 forbids skipping.
func Required() bool { return os.Getenv(EnvRequire) == "1" }

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
	var last error
	for range 5 {
		if s.port, err = freePort(false); err != nil {
			return nil, err
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if last = s.start(); last == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, last
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("server already running")
	}
	cmd := exec.Command(s.bin, s.args()...)
	out := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: out}, &lockedWriter{w: out}
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := waitPingOrExit(s.Addr, startTimeout, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("redis-server %s: %v; output:\n%s", s.Addr, err, out.String())
	}
	s.cmd, s.out = cmd, out
	s.exited = exited
	return nil
}

// Kill stops the server with SIGKILL and waits for it to exit. It is a
// no-op on an external or already stopped server. A killed server can be
// started again on the same port with Restart.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

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
	var err error
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart: %v", err)
}

// NeedOwn skips t when the server is external: the test wants to kill,
// restart or reconfigure it.
func (s *Server) NeedOwn(t testing.TB) {
	t.Helper()
	if s.External() {
		t.Skip("test needs a redis-server of its own, not the external " + s.Addr)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// freePort returns a loopback TCP port that was free a moment ago. With
// bus, port+10000 (the cluster bus port) was free too.
func freePort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port")
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
	return waitPingOrExit(addr, timeout, nil)
}

func waitPingOrExit(addr string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = Ping(addr, 500*time.Millisecond); err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before answering PING")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("no PONG within %v: %v", timeout, err)
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
		var last error
		for range 5 {
			if s.port, err = freePort(true); err != nil {
				t.Fatalf("redistest: %v", err)
			}
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
			s.extra = []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(s.dir, fmt.Sprintf("nodes-%d.conf", i)),
				"--cluster-node-timeout", "2000",
			}
			if last = s.start(); last == nil {
				break
			}
		}
		if last != nil {
			t.Fatalf("redistest: cluster node %d: %v", i, last)
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
