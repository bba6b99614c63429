package daemon_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FuzzConnection sends arbitrary bytes on one connection and checks that
// the replies are only whole OK, NO or ER lines, at most one per line sent,
// and that the server still answers a well-formed query on a new
// connection: bad input affects only its own connection.
func FuzzConnection(f *testing.F) {
	for _, s := range []string{"alice\n", "a\nb\r\n\n", strings.Repeat("x", 5000) + "\n", "\x00\xff\n", "no newline"} {
		f.Add([]byte(s))
	}
	s := start(f, config("tcp:127.0.0.1:0"))
	addr := s.Addrs()[0]
	f.Fuzz(func(t *testing.T, in []byte) {
		c := dial(t, addr)
		if _, err := c.Write(in); err != nil {
			return // the server may close a connection it finds malformed
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		out, err := io.ReadAll(c)
		if err != nil && !isReset(err) {
			t.Fatalf("reading replies: %v", err)
		}
		if len(out)%3 != 0 {
			t.Fatalf("replies %q are not whole lines", out)
		}
		for i := 0; i < len(out); i += 3 {
			if r := string(out[i : i+3]); r != "OK\n" && r != "NO\n" && r != "ER\n" {
				t.Fatalf("reply %q at %d", r, i)
			}
		}
		if lines := strings.Count(string(in), "\n") + 1; len(out)/3 > lines {
			t.Fatalf("%d replies to %d lines", len(out)/3, lines)
		}
		probe := dial(t, addr)
		if got := ask(t, probe, 1, "probe"); got != "OK\n" && got != "NO\n" {
			t.Fatalf("a new connection after bad input got %q", got)
		}
	})
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
