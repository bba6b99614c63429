package daemon_test

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FuzzConnection sends arbitrary bytes on one connection and checks that
// the replies are only whole lines of the protocol (OK, NO, ER, PONG, or
// "OK|NO remaining retry_ms reset_ms" to a ?tag query), at most one per line sent,
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
		if len(out) > 0 && out[len(out)-1] != '\n' {
			t.Fatalf("replies %q are not whole lines", out)
		}
		replies := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(out) == 0 {
			replies = nil
		}
		for i, r := range replies {
			if !validReply(r) {
				t.Fatalf("reply %d: %q", i, r)
			}
		}
		if lines := strings.Count(string(in), "\n") + 1; len(replies) > lines {
			t.Fatalf("%d replies to %d lines", len(replies), lines)
		}
		probe := dial(t, addr)
		if got := ask(t, probe, 1, "probe"); got != "OK\n" && got != "NO\n" {
			t.Fatalf("a new connection after bad input got %q", got)
		}
	})
}

// validReply reports whether r (without its newline) is a reply the
// protocol allows.
func validReply(r string) bool {
	switch r {
	case "OK", "NO", "ER", "PONG":
		return true
	}
	f := strings.Fields(r)
	if len(f) != 4 || (f[0] != "OK" && f[0] != "NO") || strings.Join(f, " ") != r {
		return false
	}
	for _, n := range f[1:] {
		if _, err := strconv.ParseUint(n, 10, 64); err != nil {
			return false
		}
	}
	return true
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
