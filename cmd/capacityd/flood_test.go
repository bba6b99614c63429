package main

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"
)

// idle opens a connection to addr that sends nothing; the channel is
// closed when the server closes it.
func idle(t *testing.T, addr string) <-chan struct{} {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, c)
	}()
	return closed
}

// allClosed fails t unless every one of conns is closed within d of t0.
func allClosed(t *testing.T, conns []<-chan struct{}, t0 time.Time, d time.Duration) {
	t.Helper()
	deadline := time.After(time.Until(t0.Add(d)))
	for i, c := range conns {
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("connection %d (of %d) still open %v after it was opened", i, len(conns), time.Since(t0).Round(time.Millisecond))
		}
	}
}

// TestConnectionFlood: 150 connections that send nothing, on each API
// port (listen and grpc_listen), five times max_connections: those beyond
// the bound are closed at once (counted in the metrics), the others once
// read_header_timeout has passed, and GetCapacity is answered again on
// both ports within a second of the flood.
func TestConnectionFlood(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
		"http": {"read_header_timeout": "500ms", "read_timeout": "1s", "max_connections": 30},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	t0 := time.Now()
	var conns []<-chan struct{}
	for range 150 {
		conns = append(conns, idle(t, a.apiLn.Addr().String()), idle(t, a.grpcLn.Addr().String()))
	}
	allClosed(t, conns, t0, 3*time.Second) // read_header_timeout and slack
	t.Logf("all %d idle connections closed %v after the flood began", len(conns), time.Since(t0).Round(time.Millisecond))
	t1 := time.Now()
	conn := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	eventually(t, "GetCapacity answers over gRPC", func() bool {
		_, err := getCapacity(conn, "alice", 10)
		return err == nil
	})
	eventually(t, "GetCapacity answers on the listen port", func() bool { return a.answers("bob") })
	if d := time.Since(t1); d > time.Second {
		t.Errorf("answered %v after the flood, want within 1s", d)
	}
	_, body := a.get(t, a.adminURL()+"/metrics")
	for _, port := range []string{"api", "grpc"} {
		_, n, _ := strings.Cut(body, "\ncapacityd_connections_refused_total{listener=\""+port+"\"} ")
		if n == "" || strings.HasPrefix(n, "0\n") {
			t.Errorf("no connections refused on %s counted: %.20q", port, n)
		}
	}
}
