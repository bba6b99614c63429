// Package testproc runs the server processes that tests need (redis-server,
// etcd): it finds free loopback ports, starts a process with its output
// captured, waits until it answers, and signals, kills or restarts it.
// The packages that start one kind of server (redistest, etcdtest) build
// on it. It also writes the files a server reads (WriteFile), runs what
// goes on beside a test (Repeat) and waits for it (Eventually).
package testproc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Unavailable skips t because a server is missing, or fails it when the
// environment variable require is "1" (so that CI cannot silently skip).
// msg says what is missing and how to provide it. A package whose
// TestMain runs through Main reports the skips at the end of its run.
func Unavailable(t testing.TB, require, msg string) {
	t.Helper()
	if Required(require) {
		t.Fatal(msg + "; " + require + "=1 forbids skipping")
	}
	recordSkip(msg + "; " + require + "=1 makes this a failure")
	t.Skip(msg)
}

// Required reports whether the environment variable require is "1".
func Required(require string) bool { return os.Getenv(require) == "1" }

// FreePort returns a loopback TCP port that was free a moment ago. With
// offset > 0, port+offset was free too (Redis Cluster's bus port).
func FreePort(offset int) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if offset <= 0 {
			return port, nil
		}
		if port+offset > 65535 {
			continue
		}
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+offset)))
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, errors.New("testproc: no free loopback port")
}

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago (held together while probing, so they differ).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Retry calls start up to tries times until it succeeds, for servers
// whose free port may be taken between probe and bind. It returns the
// last error.
func Retry(tries int, start func() error) error {
	var err error
	for range tries {
		if err = start(); err == nil {
			return nil
		}
	}
	return err
}

// RetryFor calls start until it succeeds or timeout has passed, pausing
// briefly between tries: a restarted server's old port may linger.
func RetryFor(timeout time.Duration, start func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := start()
		if err == nil || !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Eventually polls cond every millisecond until it holds, and fails t
// when it has not within timeout: for what a server, or any code running
// beside the test, does in its own time.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Repeat calls f over and over in n goroutines, each until f returns
// false or stop is called: for load or churn beside a test. stop waits
// for the goroutines to return; calls after the first do nothing.
func Repeat(n int, f func() bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if !f() {
					return
				}
			}
		})
	}
	return sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
}

// Self returns a command that runs this test binary again with args and
// the environment variables env ("NAME=value") added, which the child's
// TestMain or test looks for to play its part (a server, a client, a
// load generator).
func Self(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// Pin runs every thread of the process pid on the CPUs cpus, a list as
// taskset -c takes it ("1", "0,2-3"); the threads and processes it starts
// later inherit them, so that a process pinned before it starts servers
// has them start there (a Go server then sizes GOMAXPROCS to them). It
// needs taskset (util-linux).
func Pin(cpus string, pid int) error {
	out, err := exec.Command("taskset", "-a", "-c", "-p", cpus, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testproc: pinning %d to CPUs %s: %v: %s", pid, cpus, err, bytes.TrimSpace(out))
	}
	return nil
}

// WriteFile writes body to a file called name in a directory of t's own
// (a configuration or key file for a server under test) and returns its
// path.
func WriteFile(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Proc is a running child process. Its methods are safe for concurrent
// use.
type Proc struct {
	name   string
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan struct{}
}

// Dials returns a ready check for Start: it succeeds once addr on network
// accepts a connection (closed at once).
func Dials(network, addr string) func() error {
	return func() error {
		c, err := net.DialTimeout(network, addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
}

// Bound returns a ready check for Start that returns the moment addr on
// network accepts a connection: it dials in a tight loop, for up to 10s,
// where Start polls every 20ms. For a test that acts on a process while
// it is still starting (a signal as soon as its port is bound).
func Bound(network, addr string) func() error {
	return func() error {
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			var c net.Conn
			if c, err = net.Dial(network, addr); err == nil {
				return c.Close()
			}
		}
		return err
	}
}

// Start runs cmd with its output captured, set to die with the test
// process, and waits until ready returns nil (polled every 20ms). It fails
// when the process exits first or ready keeps failing for timeout; the
// process is then killed and the error carries its output.
func Start(cmd *exec.Cmd, timeout time.Duration, ready func() error) (*Proc, error) {
	name := cmd.Path
	out := new(lockedBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{name: name, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	if err := p.waitReady(timeout, ready); err != nil {
		p.Kill()
		return nil, fmt.Errorf("%s: %v; output:\n%s", name, err, out.String())
	}
	return p, nil
}

func (p *Proc) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = ready(); err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return errors.New("exited before it was ready")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready within %v: %v", timeout, err)
}

// SignalAtStart runs n times the process start starts, which returns it
// the moment its port is bound (see Bound), and sends it sig at once. It
// returns an error with the output of the first that does not then exit
// with code 0, having written stopped (its log line of a clean stop). A
// try whose process found its port taken ("address already in use": what
// answered was another process) does not count.
func SignalAtStart(n int, sig syscall.Signal, stopped string, start func() (*Proc, error)) error {
	for i := 0; i < n; {
		p, err := start()
		if err != nil {
			return err
		}
		code, err := p.stop(sig, 10*time.Second)
		switch {
		case err != nil:
			return fmt.Errorf("try %d: %v; output:\n%s", i, err, p.Output())
		case strings.Contains(p.Output(), "address already in use"):
			continue
		case code != 0 || !strings.Contains(p.Output(), stopped):
			return fmt.Errorf("try %d: exit code %d after %v as its port was bound; output:\n%s", i, code, sig, p.Output())
		}
		i++
	}
	return nil
}

// stop sends sig to the process and waits up to d for it to exit. It
// returns the exit code (-1 when a signal ended it), or an error when the
// process still runs after d.
func (p *Proc) stop(sig syscall.Signal, d time.Duration) (int, error) {
	if err := p.Signal(sig); err != nil {
		return 0, err
	}
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(d):
		p.Kill()
		return 0, fmt.Errorf("%s still runs %v after %v", p.name, d, sig)
	}
}

// Kill stops the process with SIGKILL (which also ends a stopped process)
// and waits for it to exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Signal sends sig to the process: syscall.SIGSTOP pauses it (Signal
// returns once every thread of the process is stopped, where /proc tells),
// syscall.SIGCONT resumes it.
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil || sig != syscall.SIGSTOP {
		return err
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !p.stopped(); {
		time.Sleep(time.Millisecond)
	}
	return nil
}

// stopped reports whether every thread of the process is stopped, or
// true where /proc cannot tell.
func (p *Proc) stopped() bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", p.Pid()))
	if err != nil || len(stats) == 0 {
		return true
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] != 'T' && b[i+2] != 't' {
			return false
		}
	}
	return true
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Output returns what the process wrote to stdout and stderr so far.
func (p *Proc) Output() string { return p.out.String() }

// Slot holds the process of a server that a test may kill and start
// again. Its zero value holds none; its methods are safe for concurrent
// use.
type Slot struct {
	mu   sync.Mutex
	proc *Proc // nil while stopped
}

// Start runs cmd as the function Start does and holds the process. It
// fails when the slot holds a running process.
func (s *Slot) Start(cmd *exec.Cmd, timeout time.Duration, ready func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("%s already running", cmd.Path)
	}
	p, err := Start(cmd, timeout, ready)
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// Kill kills the process held, if any, and waits for it to exit.
func (s *Slot) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}

// Signal sends sig to the process held; it fails when there is none.
func (s *Slot) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("not running")
	}
	return s.proc.Signal(sig)
}

// Output returns what the process held wrote so far ("" when there is
// none).
func (s *Slot) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return ""
	}
	return s.proc.Output()
}

// lockedBuffer is a bytes.Buffer written by the process's output copiers
// and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ServerMain runs m's tests for a TestMain whose package needs a server: start
// starts it and returns how to stop it. When start fails with an error
// wrapping missing (the server is not installed) every test is skipped
// with a message, unless the environment variable require is "1"; any
// other error fails the run. After tests that passed, Main fails the run
// if goroutines leaked. It returns the exit code for os.Exit.
func ServerMain(m *testing.M, require string, missing error, start func() (stop func(), err error)) int {
	stop, err := start()
	if err != nil {
		fmt.Println(err)
		if Required(require) || !errors.Is(err, missing) {
			return 1
		}
		Notice("skipped every test: %v; %s=1 makes this a failure", err, require)
		return 0
	}
	code := Main(m).Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}
