package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/failsafe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ctx = context.Background()

func server(t testing.TB, listen string) *daemon.Server {
	t.Helper()
	s, err := daemon.New(daemon.Config{Listen: []string{listen}, Default: daemon.Limit{Rate: "1/m", Burst: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s
}

func newClient(t testing.TB, network, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(network, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCheck(t *testing.T) {
	s := server(t, "tcp:127.0.0.1:0")
	c := newClient(t, "tcp", s.Addrs()[0].String(), client.WithTimeout(5*time.Second))
	for i, want := range []bool{true, true, true, false} {
		ok, err := c.Check(ctx, "alice")
		if err != nil || ok != want {
			t.Fatalf("query %d: %v, %v; want %v", i, ok, err, want)
		}
	}
	out := make([]bool, 5)
	if err := c.CheckMany(ctx, []string{"bob", "bob", "bob", "bob", "alice"}, out); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, true, false, false}; !equal(out, want) {
		t.Fatalf("CheckMany = %v, want %v", out, want)
	}
	// A large batch is pipelined in chunks.
	many := make([]string, 5000)
	for i := range many {
		many[i] = "batch"
	}
	big := make([]bool, len(many))
	if err := c.CheckMany(ctx, many, big); err != nil {
		t.Fatal(err)
	}
	if !big[0] || !big[2] || big[3] || big[4999] {
		t.Fatalf("large batch: first answers %v, last %v", big[:4], big[4999])
	}
	d, err := c.Allow(ctx, "carol", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("Allow = %+v, %v", d, err)
	}
	if _, err := c.Allow(ctx, "carol", 2); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("Allow(n=2): %v", err)
	}
	for _, bad := range []string{"", "a\nb", "a\r", strings.Repeat("x", client.MaxTagLen+1)} {
		if ok, err := c.Check(ctx, bad); ok || !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("Check(%q) = %v, %v; want ErrInvalid", bad, ok, err)
		}
	}
	if st := c.Stats(); st.Dials != 1 || st.Failures != 0 || st.Queries != 5010 {
		t.Fatalf("stats %+v: want one connection, reused", st)
	}
}

func TestUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/d.sock"
	server(t, "unix:"+sock)
	c := newClient(t, "unix", sock, client.WithTimeout(5*time.Second))
	if ok, err := c.Check(ctx, "x"); !ok || err != nil {
		t.Fatalf("Check over a Unix socket: %v, %v", ok, err)
	}
}

// A daemon that is down: fail open, then back off without dialing.
func TestFailOpenAndBackoff(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := newClient(t, "tcp", addr, client.WithBackoff(1, time.Hour, time.Hour))
	ok, err := c.Check(ctx, "alice")
	if !ok || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("down daemon: %v, %v; want fail open with ErrUnavailable", ok, err)
	}
	ok, err = c.Check(ctx, "alice")
	if !ok || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("second query: %v, %v", ok, err)
	}
	if st := c.Stats(); st.Failures != 1 || st.Skipped != 1 {
		t.Fatalf("stats %+v: want one failure, then one query skipped by the backoff", st)
	}
	d, err := c.Allow(ctx, "alice", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("Allow failing open = %+v, %v; want allowed, nil", d, err)
	}
	closed := newClient(t, "tcp", addr, client.WithPolicy(failsafe.Closed))
	if ok, err := closed.Check(ctx, "alice"); ok || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("fail closed: %v, %v", ok, err)
	}
	if _, err := closed.Allow(ctx, "alice", 1); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("Allow failing closed: %v", err)
	}
}

// A daemon that accepts but never answers: the query gives up after the
// short timeout.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	defer func() { ln.Close(); <-done }()
	c := newClient(t, "tcp", ln.Addr().String(), client.WithTimeout(20*time.Millisecond))
	start := time.Now()
	ok, err := c.Check(ctx, "alice")
	if !ok || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("silent daemon: %v, %v", ok, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("query took %v with a 20ms timeout", el)
	}
	// A context deadline sooner than the timeout wins.
	c2 := newClient(t, "tcp", ln.Addr().String(), client.WithTimeout(time.Hour))
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if ok, err := c2.Check(cctx, "alice"); !ok || !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("context deadline: %v, %v", ok, err)
	}
}

// A pooled connection that the daemon closed (it restarted) is replaced
// transparently: no failure, no backoff.
func TestReconnectAfterRestart(t *testing.T) {
	s := server(t, "tcp:127.0.0.1:0")
	addr := s.Addrs()[0].String()
	c := newClient(t, "tcp", addr, client.WithTimeout(5*time.Second))
	if ok, err := c.Check(ctx, "a"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	s.Shutdown(ctx)
	s2, err := daemon.New(daemon.Config{Listen: []string{"tcp:" + addr}, Default: daemon.Limit{Rate: "1/m", Burst: 3}}, nil)
	if err != nil {
		t.Skipf("cannot rebind %s: %v", addr, err)
	}
	s2.Start()
	defer s2.Shutdown(ctx)
	if ok, err := c.Check(ctx, "a"); !ok || err != nil {
		t.Fatalf("after restart: %v, %v", ok, err)
	}
	if st := c.Stats(); st.Failures != 0 || st.Dials != 2 {
		t.Fatalf("stats %+v: want a silent redial", st)
	}
}

func TestOptions(t *testing.T) {
	for name, f := range map[string]func() (*client.Client, error){
		"network":  func() (*client.Client, error) { return client.New("udp", "x:1") },
		"addr":     func() (*client.Client, error) { return client.New("tcp", "") },
		"timeout":  func() (*client.Client, error) { return client.New("tcp", "x:1", client.WithTimeout(0)) },
		"pool":     func() (*client.Client, error) { return client.New("tcp", "x:1", client.WithPoolSize(-1)) },
		"backoff":  func() (*client.Client, error) { return client.New("tcp", "x:1", client.WithBackoff(5, 2, 1)) },
		"nil opt":  func() (*client.Client, error) { return client.New("tcp", "x:1", nil) },
		"nil dial": func() (*client.Client, error) { return client.New("tcp", "x:1", client.WithDialer(nil)) },
	} {
		if _, err := f(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A daemon that refuses the connection ("RF": at max_conns or
// max_conns_per_addr, no idle connection to reclaim) is up and said no:
// by default the query is denied, not admitted as in an outage, and
// refusals do not start a backoff whose skipped queries would fail open.
func TestRefusalIsNotFailOpen(t *testing.T) {
	s, err := daemon.New(daemon.Config{Listen: []string{"tcp:127.0.0.1:0"}, MaxConns: 1,
		Default: daemon.Limit{Rate: "1/m", Burst: 100}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	busy, err := net.Dial("tcp", s.Addrs()[0].String()) // the one connection, active
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busy.Write([]byte("PING\n"))
	busy.Read(make([]byte, 5))
	// The default policies; a long timeout, for a loaded test machine:
	// the daemon looks up the local processes before it refuses.
	c := newClient(t, "tcp", s.Addrs()[0].String(), client.WithTimeout(5*time.Second))
	for i := range 2 * client.DefaultFailures {
		if ok, err := c.Check(ctx, "alice"); ok || !errors.Is(err, client.ErrRefused) {
			t.Fatalf("query %d, refused by the daemon: %v, %v; want denied with ErrRefused", i, ok, err)
		}
	}
	if d, err := c.Allow(ctx, "alice", 1); d.Allowed || !errors.Is(err, client.ErrRefused) {
		t.Fatalf("Allow refused by the daemon: %+v, %v; want denied with ErrRefused", d, err)
	}
	if st := c.Stats(); st.Skipped != 0 || st.Refused == 0 {
		t.Fatalf("stats %+v: refusals must not start a backoff", st)
	}
	// The refused policy is the caller's choice.
	open := newClient(t, "tcp", s.Addrs()[0].String(), client.WithRefusedPolicy(failsafe.Open))
	if ok, err := open.Check(ctx, "alice"); !ok || !errors.Is(err, client.ErrRefused) {
		t.Fatalf("WithRefusedPolicy(Open): %v, %v", ok, err)
	}
}
