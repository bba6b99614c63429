package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/internal/cmdkit"
	"github.com/throttlekit/throttle/internal/testproc"
)

// -check validates the whole configuration and binds none of its
// addresses: it passes beside a live daemon, sends nothing to the peers,
// and fails on what would fail at start.
func TestCheckBindsNothingAndSendsNothing(t *testing.T) {
	live, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	gossipLive, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gossipLive.Close()
	peer, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	cfg := `{"listen":["tcp:` + live.Addr().String() + `"],"default":{"rate":"10/s","burst":20},
		"gossip":{"listen":"` + gossipLive.LocalAddr().String() + `","peers":["` + peer.LocalAddr().String() + `"],
		"secret":"0123456789abcdef0123","interval":"10ms"}}`
	var out, errb bytes.Buffer
	if err := run([]string{"-check", "-config", testproc.WriteFile(t, "c.json", cfg), "-log-level", "warn"}, &out, &errb); err != nil {
		t.Fatalf("-check beside a live daemon: %v\n%s", err, errb.String())
	}
	peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := peer.ReadFrom(make([]byte, 2048)); err == nil {
		t.Fatalf("-check sent a %d-byte datagram to a peer", n)
	}
	for name, bad := range map[string]string{
		"bad listen":    `{"listen":["nonsense"],"default":{"rate":"1/s","burst":1}}`,
		"duplicate key": `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"listen":["127.0.0.1:2"]}`,
		"short secret":  `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"gossip":{"listen":"127.0.0.1:2","secret":"short"}}`,
		"bad admin":     `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"admin":"nowhere"}`,
	} {
		if err := run([]string{"-check", "-config", testproc.WriteFile(t, "c.json", bad)}, &out, &errb); err == nil {
			t.Errorf("-check passed %s", name)
		}
	}
}

// -print-config writes a configuration that -config reads back, to the
// same effective configuration.
func TestPrintConfigReparses(t *testing.T) {
	var first, second, errb bytes.Buffer
	if err := run([]string{"-print-config", "-rate", "7/s", "-admin", "127.0.0.1:9390"}, &first, &errb); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.ParseConfig(first.Bytes()); err != nil {
		t.Fatalf("printed config does not parse: %v\n%s", err, first.String())
	}
	if err := run([]string{"-print-config", "-config", testproc.WriteFile(t, "c.json", first.String())}, &second, &errb); err != nil {
		t.Fatal(err)
	}
	if first.String() != second.String() {
		t.Fatalf("round trip changed the config:\n%s\n%s", first.String(), second.String())
	}
}

// SIGHUP reloads the file; a bad file is refused and the daemon keeps
// running; SIGTERM stops it with no error.
func TestSignals(t *testing.T) {
	path := testproc.WriteFile(t, "c.json", `{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":2}}`)
	o := &options{Flags: cmdkit.Flags{ConfigPath: path, LogLevel: "error"}}
	cfg, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal)
	done := make(chan error, 1)
	go func() { done <- serve(srv, nil, o, &members{}, slog.New(slog.DiscardHandler), sigs) }()
	os.WriteFile(path, []byte(`{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":4}}`), 0o600)
	sigs <- syscall.SIGHUP
	for deadline := time.Now().Add(5 * time.Second); srv.Stats().Reloads == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	n := 0
	for srv.Decide("x") == "OK\n" {
		n++
	}
	if n != 4 {
		t.Fatalf("after SIGHUP the default admitted %d, want 4", n)
	}
	os.WriteFile(path, []byte(`{"listen":["tcp:127.0.0.1:0"],"default":{"rate":"1/m","burst":4}, "bogus": 1}`), 0o600)
	sigs <- syscall.SIGHUP
	sigs <- syscall.SIGTERM // received once the bad reload is done
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		srv.Shutdown(context.Background())
		t.Fatal("no exit after SIGTERM")
	}
	if st := srv.Stats(); st.Reloads != 1 || st.ReloadErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}
