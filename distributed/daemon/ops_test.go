package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/throttletest"
)

// neverReader pipelines queries on a connection and never reads a reply,
// until the server gives up on it.
func neverReader(t *testing.T, a net.Addr) <-chan struct{} {
	t.Helper()
	c, err := net.DialTimeout("tcp", a.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).SetReadBuffer(4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close()
		chunk := bytes.Repeat([]byte("a\n"), 32<<10)
		c.SetWriteDeadline(time.Now().Add(8 * time.Second))
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return done
}

// A client that pipelines and never reads is cut off at the write
// timeout: it does not hold its connection slot, and Shutdown is prompt.
func TestNeverReadingClientIsCut(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.MaxConns = 2
	cfg.IdleTimeout = daemon.Duration(300 * time.Millisecond)
	s, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	a := s.Addrs()[0]
	d1, d2 := neverReader(t, a), neverReader(t, a)
	for _, d := range []<-chan struct{}{d1, d2} {
		select {
		case <-d:
		case <-time.After(5 * time.Second):
			t.Fatal("a client that never reads still connected after 5 s")
		}
	}
	c := dial(t, a)
	if got := ask(t, c, 1, "legit"); got != "OK\n" {
		t.Fatalf("legitimate query: %q", got)
	}
	neverReader(t, a)
	time.Sleep(50 * time.Millisecond) // let it fill the buffers
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a never-reading client: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Shutdown took %v", el)
	}
}

// The default connection limit fits the file-descriptor limit.
func TestDefaultMaxConnsFitsFileLimit(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	cfg := config("tcp:127.0.0.1:0").WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns < 1 || uint64(cfg.MaxConns) >= lim.Cur {
		t.Fatalf("default max_conns %d with RLIMIT_NOFILE %d", cfg.MaxConns, lim.Cur)
	}
}

// One client address cannot take every connection.
func TestMaxConnsPerAddr(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.MaxConns = 10
	cfg.MaxConnsPerAddr = 2
	s := start(t, cfg)
	a := s.Addrs()[0]
	refuseThird(t, a) // from one address
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other, err := d.Dial("tcp", a.String())
	if err != nil {
		t.Skipf("cannot dial from 127.0.0.2: %v", err)
	}
	defer other.Close()
	other.SetDeadline(time.Now().Add(5 * time.Second))
	if got := ask(t, other, 1, "b"); got != "OK\n" {
		t.Fatalf("another address: %q", got)
	}
	if st := s.Stats(); st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// PING is answered without spending a token, and "?tag" answers carry
// the tokens left, the wait before a retry and the time until the bucket
// is full.
func TestPingAndDetailedReplies(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/s", Burst: 2}
	s := start(t, cfg)
	c := dial(t, s.Addrs()[0])
	r := bufio.NewReader(c)
	line := func(q string) string {
		t.Helper()
		io.WriteString(c, q+"\n")
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		return l
	}
	for range 5 {
		if got := line("PING"); got != "PONG\n" {
			t.Fatalf("PING: %q", got)
		}
	}
	var ok string
	var remaining, retry, reset int
	if _, err := fmt.Sscanf(line("?x"), "%s %d %d %d\n", &ok, &remaining, &retry, &reset); err != nil || ok != "OK" || remaining != 1 || retry != 0 || reset < 900 || reset > 1000 {
		t.Fatalf("?x: %s %d %d %d, %v", ok, remaining, retry, reset, err)
	}
	if got := line("x"); got != "OK\n" {
		t.Fatalf("plain query: %q", got)
	}
	if _, err := fmt.Sscanf(line("?x"), "%s %d %d %d\n", &ok, &remaining, &retry, &reset); err != nil || ok != "NO" || remaining != 0 || retry < 1 || retry > 1000 {
		t.Fatalf("?x when empty: %s %d %d %d, %v", ok, remaining, retry, reset, err)
	}
	if got := line("?"); got != "ER\n" {
		t.Fatalf("empty detailed query: %q", got)
	}
	if st := s.Stats(); st.Pings != 5 || st.Allowed != 2 || st.Throttled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestValidateRejectsDuplicatesAndBadListen(t *testing.T) {
	for name, js := range map[string]string{
		"bad listen":      `{"listen":["nonsense"],"default":{"rate":"1/s","burst":1}}`,
		"bad unix":        `{"listen":["unix:"],"default":{"rate":"1/s","burst":1}}`,
		"duplicate key":   `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"default":{"rate":"9/s","burst":9}}`,
		"nested dup key":  `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1,"burst":2}}`,
		"duplicate sock":  `{"listen":["127.0.0.1:1","tcp:127.0.0.1:1"],"default":{"rate":"1/s","burst":1}}`,
		"duplicate peer":  `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"gossip":{"listen":"127.0.0.1:2","peers":["h:1","h:1"]}}`,
		"duplicate rule":  `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"rules":[{"pattern":"a","rate":"1/s","burst":1},{"pattern":"a","rate":"2/s","burst":1}]}`,
		"peer no port":    `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"gossip":{"listen":"127.0.0.1:2","peers":["hostonly"]}}`,
		"wildcard no adv": `{"listen":["127.0.0.1:1"],"default":{"rate":"1/s","burst":1},"gossip":{"listen":"0.0.0.0:7946","peers":["10.0.0.2:7946"]}}`,
	} {
		if _, err := daemon.ParseConfig([]byte(js)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// Reload swaps the limits; an invalid or restart-only change is refused
// and the running configuration kept.
func TestReload(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 2}
	cfg.Rules = []daemon.Rule{{Pattern: "vip", Limit: daemon.Limit{Rate: "1/m", Burst: 3}}}
	s, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	s.Decide("vip")
	next := cfg
	next.Default = daemon.Limit{Rate: "1/m", Burst: 5}
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	n := 0
	for s.Decide("x") == daemon.ReplyOK {
		n++
	}
	if n != 5 {
		t.Fatalf("after reload, default admitted %d, want 5", n)
	}
	if tok := s.Tokens("vip"); tok != 2 {
		t.Fatalf("unchanged rule lost its bucket: %d tokens, want 2", tok)
	}
	bad := next
	bad.Default = daemon.Limit{Rate: "fast", Burst: 1}
	moved := next
	moved.Listen = []string{"tcp:127.0.0.1:1"}
	for _, c := range []daemon.Config{bad, moved} {
		if err := s.Reload(c); !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("Reload(bad): %v", err)
		}
	}
	if s.Decide("x") != daemon.ReplyNO || s.Decide("y") != daemon.ReplyOK {
		t.Fatal("a refused reload changed the limits")
	}
	if st := s.Stats(); st.Reloads != 1 || st.ReloadErrors != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// The admin listener serves /healthz and Prometheus metrics.
func TestAdminEndpoint(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Admin = "127.0.0.1:0"
	s := start(t, cfg)
	s.Decide("a")
	get := func(path string) string {
		t.Helper()
		cl := http.Client{Timeout: 5 * time.Second}
		r, err := cl.Get("http://" + s.AdminAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != 200 {
			t.Fatalf("%s: %s", path, r.Status)
		}
		return string(b)
	}
	if got := get("/healthz"); got != "ok\n" {
		t.Fatalf("/healthz: %q", got)
	}
	m := get("/metrics")
	for _, want := range []string{
		"# TYPE throttled_decisions_total counter\n",
		`throttled_decisions_total{decision="allowed"} 1` + "\n",
		`throttled_gossip_dropped_total{cause="bad_mac"} 0` + "\n",
		"throttled_connections 0\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, m)
		}
	}
	if st := s.Stats(); st.Queries != 1 {
		t.Fatalf("health checks spent tokens: %+v", st)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Two daemons with different secrets: each logs the dropped datagrams
// and what they probably mean, instead of limiting alone in silence.
func TestMismatchedSecretsAreLogged(t *testing.T) {
	pcs := make([]net.PacketConn, 2)
	for i := range pcs {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pcs[i] = pc
	}
	addrs := []string{pcs[0].LocalAddr().String(), pcs[1].LocalAddr().String()}
	for _, pc := range pcs {
		pc.Close()
	}
	var logs syncBuf
	for i, sec := range []string{secret, "another secret, also long enough"} {
		cfg := config("tcp:127.0.0.1:0")
		cfg.Gossip = daemon.Gossip{Listen: addrs[i], Peers: addrs, Secret: sec, Interval: daemon.Duration(10 * time.Millisecond)}
		s, err := daemon.New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Skipf("cannot rebind %s: %v", addrs[i], err)
		}
		s.Start()
		t.Cleanup(func() { s.Shutdown(context.Background()) })
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "bad_mac"); {
		if time.Now().After(deadline) {
			t.Fatalf("no log line about the bad MACs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Reloads under load: a valid tag is never answered ER (a query reaching
// a limiter the reload closed), and a changed limit keeps the usage of
// its tags: alice at 10/m burst 20, reloaded to burst 21, 22, ... and
// back, is admitted no more than the largest burst plus the refill.
// (Every changed limit started full: 20 more admitted per reload, and
// queries racing a reload got ER.)
func TestReloadKeepsUsageAndNeverER(t *testing.T) {
	clk := throttletest.NewClock()
	cfg := config("tcp:127.0.0.1:0")
	cfg.Default = daemon.Limit{Rate: "10/m", Burst: 20}
	s, err := daemon.New(cfg, nil, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	var admitted, er atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				switch s.Decide("alice") {
				case daemon.ReplyOK:
					admitted.Add(1)
				case daemon.ReplyError:
					er.Add(1)
				}
			}
		})
	}
	for i := range 50 {
		next := cfg
		next.Default.Burst = 20 + i%7
		if err := s.Reload(next); err != nil {
			t.Error(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	// 0.5 s of virtual time at 10/m earns no token; the largest burst is 26.
	if n := admitted.Load(); n > 26 || er.Load() != 0 {
		t.Fatalf("50 reloads under load: %d admitted (want at most 26), %d ER", n, er.Load())
	}
}

// A changed limit keeps its tags' usage, over reloads with or without
// queries in between: each raise admits only the difference.
func TestReloadKeepsUsage(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	s, err := daemon.New(cfg, nil, throttle.WithClock(throttletest.NewClock())) // time stands still
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	admits := func() (n int) {
		for s.Decide("alice") == daemon.ReplyOK {
			n++
		}
		return n
	}
	reload := func(bursts ...int) {
		for _, b := range bursts {
			next := cfg
			next.Default = daemon.Limit{Rate: "1/s", Burst: b}
			if err := s.Reload(next); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, step := range []struct {
		bursts []int
		want   int
	}{{nil, 20}, {[]int{25}, 5}, {[]int{30, 35}, 10}, {[]int{20}, 0}, {[]int{36}, 1}} {
		reload(step.bursts...)
		if got := admits(); got != step.want {
			t.Fatalf("after reloads to bursts %v: %d admitted, want %d", step.bursts, got, step.want)
		}
	}
}

// SIGHUP's Reload changes the static gossip peers: new ones are joined,
// those no longer listed left; the other gossip settings still need a
// restart.
func TestReloadPeers(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: secret, Peers: []string{"127.0.0.1:7001"}}
	s, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	next := cfg
	next.Gossip.Peers = []string{"127.0.0.1:7002", "127.0.0.1:7003"}
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := s.Node().Peers(); !slices.Equal(got, next.Gossip.Peers) {
		t.Fatalf("peers after reload = %v, want %v", got, next.Gossip.Peers)
	}
	moved := next
	moved.Gossip.Copies = 3
	if err := s.Reload(moved); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Reload with other copies: %v, want ErrInvalid", err)
	}
	next.Gossip.Peers = nil
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := s.Node().Peers(); len(got) != 0 {
		t.Fatalf("peers after reload without any = %v", got)
	}
}
