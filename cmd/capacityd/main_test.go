package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/internal/testproc"
)

func TestMain(m *testing.M) {
	code := testproc.Main(m).Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		// A connection the HTTP server closed for an oversized request
		// lingers for half a second by design.
		if err := goleak.Find(goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testConfig is a configuration on free loopback ports whose leases are
// short.
const testConfig = `{"listen": "127.0.0.1:0", "admin": "127.0.0.1:0", "resources": [
	{"id": "db.writes", "capacity": 50, "lease_length": "2s", "refresh_interval": "500ms"},
	{"id": "*", "capacity": 100, "algorithm": "proportional_share", "lease_length": "2s", "refresh_interval": "500ms"}]}`

func TestConfigValidation(t *testing.T) {
	res := `"resources": [{"id": "*", "capacity": 10}]`
	for _, c := range []struct{ name, cfg, want string }{
		{"not json", `{`, "unexpected EOF"},
		{"unknown field", `{"listen": "127.0.0.1:1", "bogus": 1, ` + res + `}`, `unknown field "bogus"`},
		{"duplicate key", `{"listen": "127.0.0.1:1", "listen": "127.0.0.1:2", ` + res + `}`, `key "listen" appears twice`},
		{"trailing data", `{"listen": "127.0.0.1:1", ` + res + `} {}`, "trailing data"},
		{"no listen", `{` + res + `}`, `listen ""`},
		{"bad listen port", `{"listen": "127.0.0.1:http", ` + res + `}`, `listen "127.0.0.1:http"`},
		{"bad admin", `{"listen": "127.0.0.1:1", "admin": "nowhere", ` + res + `}`, `admin "nowhere"`},
		{"bad grpc_listen", `{"listen": "127.0.0.1:1", "grpc_listen": "127.0.0.1", ` + res + `}`, `grpc_listen "127.0.0.1"`},
		{"advertise port 0", `{"listen": "127.0.0.1:1", "advertise": "10.0.0.1:0", ` + res + `}`, `advertise "10.0.0.1:0"`},
		{"no resources", `{"listen": "127.0.0.1:1"}`, "resources are required"},
		{"no catch-all", `{"listen": "127.0.0.1:1", "resources": [{"id": "db", "capacity": 10}]}`, `catch-all template with id "*"`},
		{"negative capacity", `{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": -1}]}`, "capacity must be finite and >= 0"},
		{"bad algorithm", `{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": 1, "algorithm": "lottery"}]}`, "lottery"},
		{"refresh too long", `{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": 1, "lease_length": "10s", "refresh_interval": "10s"}]}`, "refresh interval"},
		{"resource field unknown", `{"listen": "127.0.0.1:1", "resources": [{"id": "*", "capacity": 1, "rate": 3}]}`, `unknown field "rate"`},
		{"etcd without endpoints", `{"listen": "127.0.0.1:1", "etcd": {}, ` + res + `}`, "endpoints are required"},
		{"etcd empty endpoint", `{"listen": "127.0.0.1:1", "etcd": {"endpoints": [""]}, ` + res + `}`, "empty endpoint"},
		{"etcd fractional ttl", `{"listen": "127.0.0.1:1", "etcd": {"endpoints": ["127.0.0.1:2379"], "ttl": "1500ms"}, ` + res + `}`, "whole number of seconds"},
		{"etcd bad ttl", `{"listen": "127.0.0.1:1", "etcd": {"endpoints": ["127.0.0.1:2379"], "ttl": "soon"}, ` + res + `}`, "etcd: ttl"},
		{"etcd bad dial timeout", `{"listen": "127.0.0.1:1", "etcd": {"endpoints": ["127.0.0.1:2379"], "dial_timeout": "-1s"}, ` + res + `}`, "dial_timeout must be > 0"},
		{"etcd wildcard listen", `{"listen": "0.0.0.0:7400", "etcd": {"endpoints": ["127.0.0.1:2379"]}, ` + res + `}`, "advertise is required"},
		{"http bad timeout", `{"listen": "127.0.0.1:1", "http": {"read_timeout": "0s"}, ` + res + `}`, "read_timeout: want a duration > 0"},
		{"http negative bound", `{"listen": "127.0.0.1:1", "http": {"max_connections": -1}, ` + res + `}`, "max_connections must be >= 0"},
		{"negative limit", `{"listen": "127.0.0.1:1", "limits": {"max_leases": -1}, ` + res + `}`, "limits must be >= 0"},
		{"etcd port 0", `{"listen": "127.0.0.1:0", "etcd": {"endpoints": ["127.0.0.1:2379"]}, ` + res + `}`, "advertise is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", c.cfg)}, &out, &errb)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("error %v does not wrap throttle.ErrInvalid", err)
			}
		})
	}
	for _, ok := range []string{
		`{"listen": "127.0.0.1:1", ` + res + `}`,
		`{"listen": "0.0.0.0:7400", "advertise": "10.0.0.1:7400", "etcd": {"endpoints": ["127.0.0.1:2379"], "ttl": "5s"}, ` + res + `}`,
	} {
		var out, errb bytes.Buffer
		if err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", ok)}, &out, &errb); err != nil {
			t.Errorf("%s: %v", ok, err)
		} else if !strings.Contains(out.String(), "configuration valid") {
			t.Errorf("-check printed %q", out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-config", "/does/not/exist"},
		{"-log-level", "loud"}, {"-watch", "-1s"}, {"-listen", "nowhere", "-check"}} {
		var out, errb bytes.Buffer
		if err := run(args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// -check binds nothing: it passes while the configured addresses are
// taken.
func TestCheckBindsNothing(t *testing.T) {
	a := startTest(t, testConfig)
	cfg := `{"listen": "` + a.apiLn.Addr().String() + `", "admin": "` + a.adminLn.Addr().String() + `", "resources": [{"id": "*", "capacity": 1}]}`
	var out, errb bytes.Buffer
	if err := run([]string{"-check", "-config", testproc.WriteFile(t, "capacityd.json", cfg)}, &out, &errb); err != nil {
		t.Fatalf("-check beside a live server: %v", err)
	}
}

// -print-config prints the embedded default with the flags applied, and
// -config reads the output back to the same configuration.
func TestPrintConfigReparses(t *testing.T) {
	var first, second, errb bytes.Buffer
	if err := run([]string{"-print-config", "-listen", "127.0.0.1:9999"}, &first, &errb); err != nil {
		t.Fatal(err)
	}
	var got fileConfig
	if err := json.Unmarshal(first.Bytes(), &got); err != nil || got.Listen != "127.0.0.1:9999" || got.Admin != "127.0.0.1:7401" {
		t.Fatalf("printed %s (%v)", first.String(), err)
	}
	if err := run([]string{"-print-config", "-config", testproc.WriteFile(t, "capacityd.json", first.String())}, &second, &errb); err != nil {
		t.Fatal(err)
	}
	if first.String() != second.String() {
		t.Fatalf("round trip changed the config:\n%s\n%s", first.String(), second.String())
	}
}

// testApp is a capacityd started in process.
type testApp struct {
	*app
	path string
	sigs chan os.Signal
	done chan error
	logs *lockedBuffer
	hc   *http.Client
}

type lockedBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.b.String()
}

// startTest starts capacityd on the configuration file cfg, watching it
// every 10ms, and stops it when the test ends.
func startTest(t testing.TB, cfg string, extra ...string) *testApp {
	t.Helper()
	path := testproc.WriteFile(t, "capacityd.json", cfg)
	o, err := parseFlags(append([]string{"-config", path, "-watch", "10ms", "-shutdown-timeout", "5s"}, extra...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, raw, err := o.settings()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{mu: make(chan struct{}, 1)}
	a, err := start(o, s, raw, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ta := &testApp{app: a, path: path, sigs: make(chan os.Signal, 1), done: make(chan error, 1), logs: logs,
		hc: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}}
	go func() { ta.done <- a.serve(ta.sigs) }()
	t.Cleanup(func() {
		ta.hc.CloseIdleConnections()
		ta.stop(t)
	})
	return ta
}

// stop sends SIGTERM and waits for serve to return.
func (ta *testApp) stop(t testing.TB) {
	t.Helper()
	if ta.done == nil {
		return
	}
	ta.sigs <- syscall.SIGTERM
	select {
	case err := <-ta.done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stop 10s after SIGTERM")
	}
	ta.done = nil
}

func (ta *testApp) apiURL() string   { return "http://" + ta.apiLn.Addr().String() }
func (ta *testApp) adminURL() string { return "http://" + ta.adminLn.Addr().String() }

// get returns the status and body of a GET.
func (ta *testApp) get(t *testing.T, url string) (int, string) {
	t.Helper()
	code, body := getBody(ta.hc, url)
	if code == 0 {
		t.Fatalf("GET %s failed", url)
	}
	return code, body
}

// answers reports whether GetCapacity for client (1 of "db"), posted as
// JSON over a fresh connection, is answered with 200.
func (ta *testApp) answers(client string) bool {
	ta.hc.CloseIdleConnections()
	resp, err := ta.hc.Post(ta.apiURL()+getCapacityMethod, "application/json",
		strings.NewReader(`{"clientId":"`+client+`","resources":[{"resourceId":"db","wants":1}]}`))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// call posts a JSON request to an API method and decodes the answer.
func (ta *testApp) call(t *testing.T, method, body string, out any) int {
	t.Helper()
	resp, err := ta.hc.Post(ta.apiURL()+"/throttle.capacity.v1.CapacityService/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v: %s", method, err, b)
		}
	}
	return resp.StatusCode
}

// eventually polls cond every 10ms for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// delayedMaster is an election that reports the caller master after
// delay, or never when delay is negative.
type delayedMaster struct{ delay time.Duration }

func (d delayedMaster) Campaign(ctx context.Context, address string, report func(capacity.Leadership)) error {
	if d.delay >= 0 {
		select {
		case <-time.After(d.delay):
			report(capacity.Leadership{Master: address, IsMaster: true, Term: 1})
		case <-ctx.Done():
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestRunWaitsForFirstLeadership: run lets requests in once the election
// has reported, so a server that is the master alone is the master before
// it serves (it returned before the report, and TestGetCapacityJSON once
// got "not the master" on a loaded machine); an election that does not
// report lets them in after startGrace, the server not the master.
func TestRunWaitsForFirstLeadership(t *testing.T) {
	path := testproc.WriteFile(t, "capacityd.json", testConfig)
	o, err := parseFlags([]string{"-config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := o.settings()
	if err != nil {
		t.Fatal(err)
	}
	for _, delay := range []time.Duration{0, 20 * time.Millisecond, -1} {
		srv, err := newCapacityServer(s)
		if err != nil {
			t.Fatal(err)
		}
		a := &app{log: slog.New(slog.DiscardHandler), srv: srv, runDone: make(chan struct{}), advertise: "127.0.0.1:1"}
		ctx, cancel := context.WithCancel(context.Background())
		t0 := time.Now()
		a.run(ctx, delayedMaster{delay})
		took := time.Since(t0)
		l := a.lead.Load()
		switch {
		case delay >= 0 && (l == nil || !l.IsMaster):
			t.Errorf("election reporting after %v: run returned after %v, the server not yet the master (%+v)", delay, took, l)
		case delay < 0 && (l != nil || took < startGrace):
			t.Errorf("election never reporting: run returned after %v with %+v, want after %v with none", took, l, startGrace)
		}
		cancel()
		<-a.runDone
	}
}
