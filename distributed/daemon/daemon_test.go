package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		serveForBenchmark()
		return
	}
	if os.Getenv(hogEnv) != "" {
		hog()
		return
	}
	goleak.VerifyTestMain(m)
}

const secret = "test secret, long enough to use"

func config(listen ...string) daemon.Config {
	return daemon.Config{Listen: listen, Default: daemon.Limit{Rate: "1/s", Burst: 20}}
}

// started returns a started server of cfg; the caller shuts it down.
func started(t testing.TB, cfg daemon.Config, opts ...throttle.Option) *daemon.Server {
	t.Helper()
	s, err := daemon.New(cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

func start(t testing.TB, cfg daemon.Config, opts ...throttle.Option) *daemon.Server {
	t.Helper()
	s := started(t, cfg, opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}

func dial(t testing.TB, a net.Addr) net.Conn {
	t.Helper()
	c, err := net.DialTimeout(a.Network(), a.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// ask sends lines (each followed by \n) in one write and reads n replies.
func ask(t testing.TB, c net.Conn, n int, lines ...string) string {
	t.Helper()
	if _, err := io.WriteString(c, strings.Join(lines, "\n")+"\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3*n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading %d replies: %v", n, err)
	}
	return string(buf)
}

func TestProtocolTCPAndUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "throttled.sock")
	s := start(t, config("tcp:127.0.0.1:0", "unix:"+sock))
	for i, a := range s.Addrs() {
		c := dial(t, a)
		tag := fmt.Sprintf("client%d", i)
		// 21 pipelined queries: the burst of 20, then a refusal.
		lines := make([]string, 21)
		for j := range lines {
			lines[j] = tag
		}
		want := strings.Repeat("OK\n", 20) + "NO\n"
		if got := ask(t, c, 21, lines...); got != want {
			t.Fatalf("%s: replies %q, want %q", a.Network(), got, want)
		}
		// The connection is reused, one query at a time; CRLF works.
		if got := ask(t, c, 1, tag+"\r"); got != "NO\n" {
			t.Fatalf("%s: reply %q, want NO", a.Network(), got)
		}
		if got := ask(t, c, 1, "other"); got != "OK\n" {
			t.Fatalf("%s: reply %q, want OK", a.Network(), got)
		}
	}
	st := s.Stats()
	if st.Allowed != 42 || st.Throttled != 4 || st.BadQueries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMalformedInput(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.MaxTagLen = 16
	s := start(t, cfg)
	a := s.Addrs()[0]
	bystander := dial(t, a)
	if got := ask(t, bystander, 1, "x"); got != "OK\n" {
		t.Fatalf("bystander: %q", got)
	}
	c := dial(t, a)
	// An empty line gets an error and the connection goes on.
	if got := ask(t, c, 3, "a", "", "a"); got != "OK\nER\nOK\n" {
		t.Fatalf("empty line: %q", got)
	}
	// Binary junk is just a tag.
	if got := ask(t, c, 1, "\x00\xff\x01"); got != "OK\n" {
		t.Fatalf("binary tag: %q", got)
	}
	// An oversized line: an error, then the connection is closed.
	io.WriteString(c, strings.Repeat("y", 1000)+"\n")
	got, err := io.ReadAll(c)
	if string(got) != "ER\n" || err != nil {
		t.Fatalf("oversized line: %q, %v; want ER then EOF", got, err)
	}
	// A line that never ends is oversized too.
	c2 := dial(t, a)
	io.WriteString(c2, strings.Repeat("z", 100))
	if got, _ := io.ReadAll(c2); string(got) != "ER\n" {
		t.Fatalf("endless line: %q", got)
	}
	// A tag of exactly MaxTagLen is fine.
	c3 := dial(t, a)
	if got := ask(t, c3, 1, strings.Repeat("t", 16)); got != "OK\n" {
		t.Fatalf("tag of MaxTagLen: %q", got)
	}
	// Half a line, then the client hangs up: no harm.
	c4 := dial(t, a)
	io.WriteString(c4, "half")
	c4.Close()
	if got := ask(t, bystander, 1, "x"); got != "OK\n" {
		t.Fatalf("bystander after the abuse: %q", got)
	}
	if st := s.Stats(); st.BadQueries != 3 {
		t.Fatalf("BadQueries %d, want 3", st.BadQueries)
	}
}

func TestRules(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.Rules = []daemon.Rule{
		{Pattern: "vip", Limit: daemon.Limit{Rate: "1/s", Burst: 5}},
		{Pattern: "api-*", Limit: daemon.Limit{Rate: "1/s", Burst: 2}},
		{Pattern: "ip-10.?.*", Limit: daemon.Limit{Rate: "1/s", Burst: 3}},
	}
	s, err := daemon.New(cfg, nil, throttle.WithClock(throttletest.NewClock()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	admits := func(tag string) int {
		n := 0
		for s.Decide(tag) == daemon.ReplyOK {
			n++
		}
		return n
	}
	for tag, want := range map[string]int{"vip": 5, "api-x": 2, "api-": 2, "ip-10.1.2.3": 3, "ip-10.12.3": 20, "vipx": 20, "other": 20} {
		if got := admits(tag); got != want {
			t.Errorf("%q admitted %d, want %d", tag, got, want)
		}
	}
}

func TestConfig(t *testing.T) {
	d := daemon.DefaultConfig()
	if len(d.Listen) != 1 || d.Listen[0] != "tcp:127.0.0.1:7390" || d.Default.Burst != 20 || d.MaxTagLen != 256 {
		t.Fatalf("default config %+v", d)
	}
	good := `{"listen":["unix:/tmp/x.sock","127.0.0.1:1"],"default":{"rate":"100/s","burst":10},
		"rules":[{"pattern":"a*","rate":"5/1m","burst":1}],
		"gossip":{"listen":"127.0.0.1:0","peers":["127.0.0.1:2"],"interval":"100ms","secret":"s","spend_cap":true,"copies":3}}`
	c, err := daemon.ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(c.Gossip.Interval) != 100*time.Millisecond || !c.Gossip.SpendCap || c.Gossip.Copies != 3 || c.Rules[0].Burst != 1 {
		t.Fatalf("parsed %+v", c)
	}
	for name, bad := range map[string]string{
		"unknown field":   `{"listen":["x:1"],"default":{"rate":"1/s","burst":1},"bogus":1}`,
		"no listen":       `{"default":{"rate":"1/s","burst":1}}`,
		"bad rate":        `{"listen":["x:1"],"default":{"rate":"fast","burst":1}}`,
		"zero rate":       `{"listen":["x:1"],"default":{"rate":"0/s","burst":1}}`,
		"zero burst":      `{"listen":["x:1"],"default":{"rate":"1/s","burst":0}}`,
		"peers no listen": `{"listen":["x:1"],"default":{"rate":"1/s","burst":1},"gossip":{"peers":["a:1"]}}`,
		"bad interval":    `{"listen":["x:1"],"default":{"rate":"1/s","burst":1},"gossip":{"interval":"soon"}}`,
		"tag len":         `{"listen":["x:1"],"default":{"rate":"1/s","burst":1},"max_tag_len":5000}`,
		"empty pattern":   `{"listen":["x:1"],"default":{"rate":"1/s","burst":1},"rules":[{"pattern":"","rate":"1/s","burst":1}]}`,
		"trailing":        `{"listen":["x:1"],"default":{"rate":"1/s","burst":1}} {}`,
		"not json":        `listen: x`,
	} {
		if _, err := daemon.ParseConfig([]byte(bad)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	// Advertise names the node.
	adv := config("tcp:127.0.0.1:0")
	adv.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Advertise: "gw-3.example:7946", Secret: secret}
	if s, err := daemon.New(adv, nil); err != nil {
		t.Fatal(err)
	} else {
		if id := s.Node().ID(); id != "gw-3.example:7946" {
			t.Errorf("node ID %q, want the advertised address", id)
		}
		s.Shutdown(context.Background())
	}
	// Copies out of range is refused.
	many := config("tcp:127.0.0.1:0")
	many.Gossip = daemon.Gossip{Listen: "127.0.0.1:0", Secret: secret, Copies: 9}
	if _, err := daemon.New(many, nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("gossip copies 9: %v, want ErrInvalid", err)
	}
	// Gossip without a secret is refused.
	cfg := config("tcp:127.0.0.1:0")
	cfg.Gossip.Listen = "127.0.0.1:0"
	t.Setenv("THROTTLED_SECRET", "")
	if _, err := daemon.New(cfg, nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("gossip without secret: %v", err)
	}
}

func TestShutdownAnswersPipelinedQueries(t *testing.T) {
	s, err := daemon.New(config("tcp:127.0.0.1:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	c := dial(t, s.Addrs()[0])
	if got := ask(t, c, 1, "a"); got != "OK\n" {
		t.Fatal(got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("connection after shutdown: %v, want EOF", err)
	}
	if _, err := net.DialTimeout("tcp", s.Addrs()[0].String(), time.Second); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

func raiseFileLimit(t *testing.T, want uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("cannot read RLIMIT_NOFILE: %v", err)
	}
	if lim.Cur >= want {
		return
	}
	old := lim
	lim.Cur = min(want, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < want {
		t.Skipf("need %d file descriptors for this test; RLIMIT_NOFILE is %d (hard %d) and cannot be raised: %v",
			want, old.Cur, old.Max, err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// TestTenThousandConnections holds 10,000 client connections open at once
// against one server. The clients run in a child process (this test
// binary again), so that each process needs only ~10k descriptors.
func TestTenThousandConnections(t *testing.T) {
	const n = 10000
	if addr := os.Getenv("THROTTLED_TEST_CLIENTS"); addr != "" {
		tenThousandClients(t, addr, n)
		return
	}
	if testing.Short() {
		t.Skip("short mode")
	}
	raiseFileLimit(t, n+1000)
	cfg := config("tcp:127.0.0.1:0")
	cfg.MaxConnsPerAddr = n // above the default for one address, sized by memory
	s := start(t, cfg)
	cmd := testproc.Self([]string{"THROTTLED_TEST_CLIENTS=" + s.Addrs()[0].String()}, "-test.run=^TestTenThousandConnections$", "-test.v")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	var ok, no int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "RESULT ok=%d no=%d", &ok, &no); err == nil {
			break
		}
		if strings.Contains(sc.Text(), "SKIP") || strings.Contains(sc.Text(), "FAIL") {
			t.Fatalf("client process: %s", sc.Text())
		}
	}
	if ok+no != n {
		t.Fatalf("client process reported ok=%d no=%d, want %d replies", ok, no, n)
	}
	if st := s.Stats(); st.Conns != n {
		t.Errorf("server holds %d connections, want %d", st.Conns, n)
	}
	// 100 tags, 100 queries each, burst 20 (the rate adds a few).
	if ok < 100*20 || ok > 100*25 {
		t.Errorf("admitted %d, refused %d; want about 2000 admitted", ok, no)
	}
	stdin.Close()
	go io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client process: %v", err)
	}
	eventually(t, func() bool { return s.Stats().Conns == 0 })
}

func tenThousandClients(t *testing.T, addr string, n int) {
	raiseFileLimit(t, uint64(n)+1000)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// Every connection asks, then every one reads: all are open at once.
	for i, c := range conns {
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := fmt.Fprintf(c, "tag%d\n", i%100); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	ok, no := 0, 0
	var buf [3]byte
	for i, c := range conns {
		if _, err := io.ReadFull(c, buf[:]); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		switch string(buf[:]) {
		case "OK\n":
			ok++
		case "NO\n":
			no++
		default:
			t.Fatalf("reply %q", buf[:])
		}
	}
	fmt.Printf("RESULT ok=%d no=%d\n", ok, no)
	io.Copy(io.Discard, os.Stdin) // hold the connections until the parent has counted them
}

func TestMaxConns(t *testing.T) {
	cfg := config("tcp:127.0.0.1:0")
	cfg.MaxConns = 2
	c1 := refuseThird(t, start(t, cfg).Addrs()[0])
	if got := ask(t, c1, 1, "a"); got != "OK\n" {
		t.Fatalf("first connection after the rejection: %q", got)
	}
}

// Three daemons gossiping over UDP on loopback, on virtual time, driven
// through the client; one is killed and restarted.
func TestClusterOverUDP(t *testing.T) {
	clk := throttletest.NewClock()
	mk := func(gossipAddr string) *daemon.Server {
		cfg := config("tcp:127.0.0.1:0")
		cfg.Default = daemon.Limit{Rate: "1/m", Burst: 10}
		cfg.Gossip = daemon.Gossip{Listen: gossipAddr, Secret: secret, Interval: daemon.Duration(time.Second)}
		return started(t, cfg, throttle.WithClock(clk))
	}
	srv := []*daemon.Server{mk("127.0.0.1:0"), mk("127.0.0.1:0"), mk("127.0.0.1:0")}
	defer func() {
		for _, s := range srv {
			s.Shutdown(context.Background())
		}
	}()
	join := func() {
		for _, s := range srv {
			for _, p := range srv {
				if p != s {
					if err := s.Node().Join(p.Node().ID()); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	join()
	cl := make([]*client.Client, 3)
	for i, s := range srv {
		c, err := client.New("tcp", s.Addrs()[0].String(), client.WithTimeout(5*time.Second), client.WithPolicy(failsafe.Closed))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cl[i] = c
	}
	check := func(i int, tag string) bool {
		t.Helper()
		ok, err := cl[i].Check(context.Background(), tag)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// round advances the clock to the next boundary, runs a gossip round
	// on every node and waits until each node has heard from every other.
	round := func() {
		t.Helper()
		before := make([]uint64, len(srv))
		for i, s := range srv {
			before[i] = s.Stats().Gossip.PacketsReceived
		}
		clk.Advance(time.Second)
		for _, s := range srv {
			s.Node().Tick()
		}
		eventually(t, func() bool {
			for i, s := range srv {
				if s.Stats().Gossip.PacketsReceived < before[i]+uint64(len(srv)-1) {
					return false
				}
			}
			return true
		})
	}
	round() // introductions
	// alice spends her burst of 10 on daemon 0.
	for i := range 10 {
		if !check(0, "alice") {
			t.Fatalf("daemon 0 refused alice's request %d", i+1)
		}
	}
	if check(0, "alice") {
		t.Fatal("daemon 0 admitted an 11th request at once")
	}
	if !check(1, "alice") {
		t.Fatal("daemon 1 refused alice before any gossip")
	}
	round()
	// Every daemon has now been charged the 11 admitted units (10 + 1):
	// alice is refused everywhere.
	for i := range srv {
		if check(i, "alice") {
			t.Fatalf("daemon %d admitted alice after the gossip round", i)
		}
		if tok := srv[i].Tokens("alice"); tok > 0 {
			t.Fatalf("daemon %d: alice has %d tokens, want <= 0", i, tok)
		}
	}
	if st := srv[2].Stats().Gossip; st.HitsApplied != 11 {
		t.Fatalf("daemon 2 applied %d hits, want 11", st.HitsApplied)
	}

	// Kill daemon 2: the others keep answering.
	gaddr := srv[2].Node().ID()
	srv[2].Shutdown(context.Background())
	cl[2].Close()
	clk.Advance(time.Second)
	srv[0].Node().Tick()
	srv[1].Node().Tick()
	if !check(0, "bob") || !check(1, "bob") {
		t.Fatal("survivors refused a fresh tag")
	}
	// Restart it on the same gossip address, a few seconds later.
	clk.Advance(3 * time.Second)
	srv[2] = mk(gaddr)
	for _, p := range srv[:2] {
		if err := srv[2].Node().Join(p.Node().ID()); err != nil {
			t.Fatal(err)
		}
	}
	c2, err := client.New("tcp", srv[2].Addrs()[0].String(), client.WithTimeout(5*time.Second), client.WithPolicy(failsafe.Closed))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	cl[2] = c2
	// Introductions: the restarted daemon's hellos reach the survivors;
	// their datagrams of this round still name its previous life, which
	// it refuses (identity only moves forward).
	before := []uint64{srv[0].Stats().Gossip.PacketsReceived, srv[1].Stats().Gossip.PacketsReceived}
	clk.Advance(time.Second)
	for _, s := range srv {
		s.Node().Tick()
	}
	eventually(t, func() bool {
		return srv[0].Stats().Gossip.PacketsReceived >= before[0]+2 && srv[1].Stats().Gossip.PacketsReceived >= before[1]+2 // from each other and from it
	})
	// The restarted daemon's buckets are fresh; the next rounds send it
	// the survivors' bucket levels, so it refuses alice again.
	round()
	round()
	if tok, want := srv[2].Tokens("alice"), srv[0].Tokens("alice"); tok != want || tok > 0 {
		t.Fatalf("restarted daemon: alice has %d tokens, want %d (<= 0) after the state sync", tok, want)
	}
	if check(2, "alice") {
		t.Fatal("restarted daemon admitted alice")
	}
	for i, s := range srv {
		if st := s.Stats().Gossip; st.BadMAC+st.Malformed+st.UnknownSender != 0 {
			t.Errorf("daemon %d dropped datagrams: %+v", i, st)
		}
	}
}

// refuseThird makes two connections to a, each answered, and checks that
// a third is refused and closed; it returns the first.
func refuseThird(t *testing.T, a net.Addr) net.Conn {
	t.Helper()
	c1, c2 := dial(t, a), dial(t, a)
	ask(t, c1, 1, "a")
	ask(t, c2, 1, "a")
	if got, _ := io.ReadAll(dial(t, a)); string(got) != daemon.ReplyRefused {
		t.Fatalf("third connection got %q, want %q and closed", got, daemon.ReplyRefused)
	}
	return c1
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	testproc.Eventually(t, 10*time.Second, cond)
}

func ExampleServer() {
	cfg := daemon.DefaultConfig()
	cfg.Listen = []string{"tcp:127.0.0.1:0"}
	cfg.Default = daemon.Limit{Rate: "1/s", Burst: 2}
	s, _ := daemon.New(cfg, nil)
	s.Start()
	defer s.Shutdown(context.Background())

	c, _ := net.Dial("tcp", s.Addrs()[0].String())
	defer c.Close()
	io.WriteString(c, "alice\nalice\nalice\n") // pipelined
	r := bufio.NewReader(c)
	for range 3 {
		line, _ := r.ReadString('\n')
		fmt.Print(line)
	}
	// Output:
	// OK
	// OK
	// NO
}

// DefaultConfig and ParseConfig return the configuration as
// written: derived settings follow what a caller changes before New.
// (DefaultConfig returned a validated config, so WriteTimeout stayed 10s
// after IdleTimeout was set to 1s.) Absurd timeouts are refused.
func TestConfigDerivedAndTimeouts(t *testing.T) {
	c := daemon.DefaultConfig()
	c.IdleTimeout = daemon.Duration(time.Second)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.WriteTimeout != 0 {
		t.Fatalf("Validate filled in write_timeout %v", time.Duration(c.WriteTimeout))
	}
	c = c.WithDefaults()
	if c.WriteTimeout != daemon.Duration(time.Second) || c.IdleBudget != daemon.Duration(time.Second) || c.MaxTagLen != 256 {
		t.Fatalf("DefaultConfig with idle_timeout 1s, with its defaults: write_timeout %v, idle_budget %v, max_tag_len %d; want 1s, 1s, 256",
			time.Duration(c.WriteTimeout), time.Duration(c.IdleBudget), c.MaxTagLen)
	}
	if c := daemon.DefaultConfig().WithDefaults(); c.Validate() != nil || c.IdleBudget != daemon.Duration(10*time.Second) {
		t.Fatalf("default idle_budget %v, want 10s", time.Duration(c.IdleBudget))
	}
	for _, f := range []string{"idle_timeout", "write_timeout", "idle_budget"} {
		for _, v := range []string{"1ns", "1ms", "-1s"} {
			js := fmt.Sprintf(`{"listen":["x:1"],"default":{"rate":"1/s","burst":1},%q:%q}`, f, v)
			if _, err := daemon.ParseConfig([]byte(js)); !errors.Is(err, throttle.ErrInvalid) {
				t.Errorf("%s %s: %v, want an error wrapping ErrInvalid", f, v, err)
			}
		}
	}
}
