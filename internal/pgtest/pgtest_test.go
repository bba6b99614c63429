package pgtest_test

import (
	"net"
	"strings"
	"testing"

	"github.com/throttlekit/throttle/internal/pgtest"
)

// TestStartKillRestart: a started server accepts TCP connections on
// loopback, stops accepting them when killed, and accepts them again on
// the same port after Restart.
func TestStartKillRestart(t *testing.T) {
	s := pgtest.Start(t)
	s.NeedOwn(t)
	addr := strings.TrimPrefix(strings.Split(s.URL, "/")[2], "postgres@")
	dial := func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatalf("started server: %v", err)
	}
	s.Kill()
	if dial() == nil {
		t.Fatal("a killed server still accepts connections")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err != nil {
		t.Fatalf("restarted server: %v", err)
	}
}
