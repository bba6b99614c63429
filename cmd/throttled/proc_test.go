package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/internal/testproc"
)

// runMainEnv makes the test binary run throttled's main instead of the
// tests: the tests below start the real daemon as a process of its own.
const runMainEnv = "THROTTLED_TEST_RUN_MAIN"

// throttled returns a command that runs throttled's main with args.
func throttled(args ...string) *exec.Cmd { return testproc.Self([]string{runMainEnv + "=1"}, args...) }

// daemonProc is a throttled process listening on a free loopback TCP port
// and a Unix socket.
type daemonProc struct {
	*testproc.Proc
	tcp, unix string
}

// startDaemon runs throttled with the JSON settings extra (fields after
// "listen" and "default", e.g. `"idle_timeout":"1s"`) and the default
// limit 1000000/s, burst 1000000. It is killed at the end of the test.
func startDaemon(t *testing.T, extra string) *daemonProc {
	t.Helper()
	d := &daemonProc{unix: filepath.Join(t.TempDir(), "t.sock")}
	err := testproc.Retry(5, func() error {
		port, err := testproc.FreePort(0)
		if err != nil {
			return err
		}
		d.tcp = fmt.Sprintf("127.0.0.1:%d", port)
		if extra != "" {
			extra = "," + extra
		}
		cfg := testproc.WriteFile(t, "c.json", fmt.Sprintf(`{"listen":["tcp:%s","unix:%s"],"default":{"rate":"1000000/s","burst":1000000}%s}`, d.tcp, d.unix, extra))
		extra = strings.TrimPrefix(extra, ",")
		d.Proc, err = testproc.Start(throttled("-config", cfg, "-log-level", "warn"), 10*time.Second, func() error {
			if err := testproc.Dials("tcp", d.tcp)(); err != nil {
				return err
			}
			return testproc.Dials("unix", d.unix)()
		})
		return err
	})
	if err != nil {
		t.Fatalf("throttled: %v", err)
	}
	t.Cleanup(d.Kill)
	return d
}

// dial connects to the daemon's TCP socket, until the test ends.
func (d *daemonProc) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", d.tcp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A client that pipelines continuously and reads every reply is never
// idle: it is not reset after idle_timeout, and every query is answered.
// (The daemon renewed its read deadline, and flushed its replies, only
// when its read buffer happened to be empty: never, for a stream whose
// writes end mid-line; it reset such a client after idle_timeout.)
func TestPipeliningClientIsNotIdle(t *testing.T) {
	d := startDaemon(t, `"idle_timeout":"300ms"`)
	c := d.dial(t)
	// A steady stream whose every write ends in the middle of a line:
	// "ab", then "cd\nab" every 5 ms, then "cd\n".
	sent := 1
	werr := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, "ab")
		stop := time.Now().Add(1500 * time.Millisecond) // five idle timeouts
		for err == nil && time.Now().Before(stop) {
			time.Sleep(5 * time.Millisecond)
			if _, err = io.WriteString(c, "cd\nab"); err == nil {
				sent++
			}
		}
		if err == nil {
			_, err = io.WriteString(c, "cd\n")
		}
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := 0
	buf := make([]byte, 64<<10)
	var rerr error
	for {
		n, err := c.Read(buf)
		got += n
		if err != nil {
			rerr = err
			break
		}
	}
	if err := <-werr; err != nil || !errors.Is(rerr, io.EOF) || got != 3*sent {
		t.Fatalf("pipelining for 1.5s with idle_timeout 300ms: write %v, read %v; %d replies of %d queries", err, rerr, got/3, sent)
	}
}

// A write that ends mid-line gets the replies to its complete lines at
// once, not after idle_timeout.
func TestRepliesDoNotWaitForTheNextLine(t *testing.T) {
	d := startDaemon(t, `"idle_timeout":"1m"`)
	c := d.dial(t)
	io.WriteString(c, "a\nb\npart")
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var buf [6]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil || string(buf[:]) != "OK\nOK\n" {
		t.Fatalf("replies to two complete lines before the rest of the third: %q, %v", buf[:], err)
	}
}

// A client that sends queries and never reads a reply is reset once its
// replies have waited write_timeout, long before idle_timeout: it cannot
// pin kernel memory. (The daemon wrote every reply into its large send
// buffer and held them for idle_timeout, then closed with a FIN that
// left them in an orphan socket for minutes more.)
func TestNeverReadingClientIsReset(t *testing.T) {
	d := startDaemon(t, `"idle_timeout":"5m","write_timeout":"500ms"`)
	c := d.dial(t)
	c.(*net.TCPConn).SetReadBuffer(4096)
	// 40,000 queries (120 KB of replies), sent once; then silence.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(bytes.Repeat([]byte("a\n"), 40000)); err != nil && !isReset(err) {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // leave the replies unread meanwhile
	_, err := io.Copy(io.Discard, c)
	if !isReset(err) {
		t.Fatalf("never-reading client: %v, want a reset", err)
	}
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Over the Unix socket, one process cannot take every connection: beyond
// max_conns_per_addr it is refused ("RF", client.ErrRefused), and another
// process still gets answers.
func TestUnixSocketCapPerProcess(t *testing.T) {
	d := startDaemon(t, `"max_conns":100,"max_conns_per_addr":4`)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 4 {
		c, err := net.Dial("unix", d.unix)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if _, err := query(c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New("unix", d.unix, client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Check(context.Background(), "x"); !errors.Is(err, client.ErrRefused) {
		t.Fatalf("fifth connection of one process: %v, want client.ErrRefused", err)
	}
	// Another process (throttled's own query mode) is answered.
	if out, err := queryProcess("unix:"+d.unix, "y"); err != nil || out != "y OK" {
		t.Fatalf("another process: %q, %v", out, err)
	}
}

// A SIGTERM sent the moment the TCP port accepts connections, while
// throttled is still starting, stops it as cleanly as a later one (exit
// 0): it registers for signals before it binds. Before, the signal's
// default action killed it in that window (exit code -1).
func TestStopWhileStarting(t *testing.T) {
	err := testproc.SignalAtStart(20, syscall.SIGTERM, "shutting down", func() (*testproc.Proc, error) {
		port, err := testproc.FreePort(0)
		if err != nil {
			return nil, err
		}
		tcp := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := testproc.WriteFile(t, "c.json", fmt.Sprintf(`{"listen":["tcp:%s"],"default":{"rate":"100/s","burst":10}}`, tcp))
		return testproc.Start(throttled("-config", cfg), 10*time.Second, testproc.Bound("tcp", tcp))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// SIGTERM answers every query the daemon received before it, even those
// not read yet, then exits 0. (It answered only what it had read.)
func TestSIGTERMAnswersReceivedQueries(t *testing.T) {
	d := startDaemon(t, "")
	c := d.dial(t)
	if _, err := query(c, "warm"); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	// Stopped, the daemon receives 20,000 queries into its socket buffer
	// and the signal; it resumes with both waiting.
	if err := d.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	if _, err := c.Write(bytes.Repeat([]byte("q\n"), n)); err != nil {
		d.Signal(syscall.SIGCONT)
		t.Fatal(err)
	}
	d.Signal(syscall.SIGTERM)
	d.Signal(syscall.SIGCONT)
	got, err := io.ReadAll(c)
	if len(got) != 3*n {
		t.Errorf("after SIGTERM: %d replies to %d queries received before it (%v)", len(got)/3, n, err)
	}
	select {
	case <-d.Exited():
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}
