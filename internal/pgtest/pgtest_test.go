package pgtest_test

import (
	"strings"
	"testing"

	"github.com/throttlekit/throttle/internal/pgtest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// TestStartKillRestart: a started server accepts TCP connections on
// loopback, stops accepting them when killed, and accepts them again on
// the same port after Restart.
func TestStartKillRestart(t *testing.T) {
	s := pgtest.Start(t)
	s.NeedOwn(t)
	dial := testproc.Dials("tcp", strings.TrimPrefix(strings.Split(s.URL, "/")[2], "postgres@"))
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
