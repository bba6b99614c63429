// Package pgtest starts real PostgreSQL servers for tests: a fresh cluster
// (initdb) in a temporary directory, listening on a free loopback port
// and a socket directory of its own, killed when the test ends. PostgreSQL
// refuses to run as root, so under root the server runs as the postgres
// user of the Debian package.
//
// Start honours two environment variables:
//
//   - THROTTLE_POSTGRES_URL=postgres://... uses an existing server instead
//     of starting one (tests that kill or restart the server then skip);
//   - THROTTLE_REQUIRE_POSTGRES=1 turns "PostgreSQL is not installed" from
//     a skip into a failure, so that CI cannot silently skip.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/testproc"
)

// Environment variables read by Start and StartServer.
const (
	EnvURL     = "THROTTLE_POSTGRES_URL"
	EnvRequire = "THROTTLE_REQUIRE_POSTGRES"
)

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 30 * time.Second

// ErrNoServer is returned by StartServer when PostgreSQL is not installed.
var ErrNoServer = errors.New("pgtest: postgres unavailable: install the postgresql package, or set " + EnvURL + " to a connection URL")

// Required reports whether THROTTLE_REQUIRE_POSTGRES=1.
func Required() bool { return testproc.Required(EnvRequire) }

// Server is a PostgreSQL server used by tests: one this package started,
// or the external server named by THROTTLE_POSTGRES_URL. Its methods are
// safe for concurrent use.
type Server struct {
	// URL is a connection string for the database "postgres" as the
	// superuser, over TCP on 127.0.0.1.
	URL string

	bin  string // directory of initdb, postgres and pg_isready
	dir  string // owns data/ and the socket directory
	port int
	cred *syscall.Credential // the postgres user when running as root

	proc testproc.Slot
}

// Start returns a running server for t: the external one named by
// THROTTLE_POSTGRES_URL if set, otherwise a fresh cluster on a free
// 127.0.0.1 port, killed and removed at the end of the test. Without
// PostgreSQL it skips t (or fails it under THROTTLE_REQUIRE_POSTGRES=1).
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartServer()
	if errors.Is(err, ErrNoServer) {
		testproc.Unavailable(t, EnvRequire, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartServer is Start outside of a test, for TestMain: it returns a
// running server, which the caller stops with Close, or ErrNoServer.
func StartServer() (*Server, error) {
	if url := os.Getenv(EnvURL); url != "" {
		return &Server{URL: url}, nil
	}
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	// Under /tmp rather than a test's TempDir: the postgres user must be
	// able to reach it.
	if s.dir, err = os.MkdirTemp("", "pgtest"); err != nil {
		return nil, err
	}
	if err := s.initdb(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	err = testproc.Retry(5, func() error { // a free port may be taken between probe and bind
		if s.port, err = testproc.FreePort(0); err != nil {
			return err
		}
		s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
		return s.start()
	})
	if err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

// binDir finds the server's programs where the Debian package puts them
// (the newest version), or else on PATH.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if hasAll(d, "initdb", "postgres", "pg_isready") {
			return d, nil
		}
	}
	return "", ErrNoServer
}

func hasAll(dir string, names ...string) bool {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// postgresUser is the credential of the postgres user.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w (running as root needs the postgres user: %v)", ErrNoServer, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// command runs one of the server's programs as the server's user.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

func (s *Server) initdb() error {
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	cmd := s.command("initdb", "-D", filepath.Join(s.dir, "data"), "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	return nil
}

// start runs the server and waits until it accepts connections. It runs
// with production durability (fsync, synchronous_commit and
// full_page_writes on, PostgreSQL's defaults), so that what a test or a
// benchmark measures is what a deployment pays: every commit waits for
// its WAL flush.
func (s *Server) start() error {
	cmd := s.command("postgres", "-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(s.port), "-k", s.dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on", "-c", "max_connections=200")
	ready := func() error {
		return s.command("pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres").Run()
	}
	if err := s.proc.Start(cmd, startTimeout, ready); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// External reports whether the server was not started by this package
// (THROTTLE_POSTGRES_URL); such a server cannot be killed or restarted.
func (s *Server) External() bool { return s.bin == "" }

// NeedOwn skips t when the server is external.
func (s *Server) NeedOwn(t testing.TB) {
	t.Helper()
	if s.External() {
		t.Skip("needs a server of its own; " + EnvURL + " names an external one")
	}
}

// Kill stops the server with SIGKILL, as a crash would; its backends exit
// when they notice. It does nothing when the server is not running.
func (s *Server) Kill() { s.proc.Kill() }

// Restart starts a killed server again on the same port and data, after
// crash recovery. It retries while the old backends still hold the
// shared memory or the port.
func (s *Server) Restart() error {
	return testproc.RetryFor(startTimeout, s.start)
}

// Close kills a server this package started and removes its directory.
func (s *Server) Close() {
	if s.External() {
		return
	}
	s.Kill()
	os.RemoveAll(s.dir)
}
