package capacity

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

func testConfig(capacity float64) Config {
	return Config{Resources: []Template{
		{ID: "r", Capacity: capacity, LeaseLength: 20 * time.Second, RefreshInterval: 5 * time.Second},
		{ID: "*", Capacity: 10, Algorithm: ProportionalShare},
	}}
}

func newTestServer(t *testing.T, cfg Config, opts ...ServerOption) (*Server, *throttletest.Clock) {
	t.Helper()
	clk := throttletest.NewClock()
	s, err := NewServer(cfg, append([]ServerOption{WithServerClock(clk), withSeed(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

func ask(t *testing.T, s *Server, client string, rrs ...ResourceRequest) []Grant {
	t.Helper()
	resp, err := s.GetCapacity(context.Background(), &Request{Client: client, Resources: rrs})
	if err != nil {
		t.Fatalf("GetCapacity(%s): %v", client, err)
	}
	if resp.Redirect {
		t.Fatalf("GetCapacity(%s): redirect to %q", client, resp.Master)
	}
	return resp.Grants
}

func held(s *Server, id string) float64 {
	for _, r := range s.Status().Resources {
		if r.ID == id {
			return r.Held
		}
	}
	return 0
}

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"resources": [
		{"id": "db.*", "capacity": 10, "algorithm": "proportional_share", "lease_length": "10s", "max_lease_length": "1m"},
		{"id": "db.writes", "capacity": 500, "lease_length": "30s", "refresh_interval": "5s", "safe_capacity": 20},
		{"id": "*", "capacity": 100, "algorithm": "static"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if tm, _ := cfg.match("db.writes"); tm.MaxLeaseLength != 0 {
		t.Errorf("ParseConfig filled in defaults: %+v", tm)
	}
	cfg = cfg.withDefaults()
	for id, want := range map[string]float64{"db.writes": 500, "db.reads": 10, "other": 100} {
		if tm, ok := cfg.match(id); !ok || tm.Capacity != want {
			t.Errorf("match(%q) = %+v, want capacity %v", id, tm, want)
		}
	}
	tm, _ := cfg.match("db.writes")
	if tm.LeaseLength != 30*time.Second || tm.RefreshInterval != 5*time.Second || tm.MaxLeaseLength != 30*time.Second || tm.LearningDuration != 30*time.Second || tm.Algorithm != FairShare {
		t.Errorf("template %+v", tm)
	}
	if tm, _ := cfg.match("db.reads"); tm.MaxLeaseLength != time.Minute || tm.LearningDuration != time.Minute {
		t.Errorf("a new master learns for the max lease length: %+v", tm)
	}
	for _, bad := range []string{
		`{"resources": [{"id": "*", "capacity": 1, "lease": "1s"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "lease_length": "10s", "max_lease_length": "5s"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "max_lease_length": "25h"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "max_lease_length": "2m", "learning_duration": "1m"}]}`,
		`{"resources": [{"id": "x", "capacity": 1}]}`,
		`{"resources": [{"id": "*", "capacity": -1}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "algorithm": "magic"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "lease_length": "10s", "refresh_interval": "10s"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "learning_duration": "1s"}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "safe_capacity": 2}]}`,
		`{"resources": [{"id": "*", "capacity": 1}, {"id": "*", "capacity": 2}]}`,
		`{"resources": [{"id": "[", "capacity": 1}, {"id": "*", "capacity": 2}]}`,
		`{"resources": [{"id": "*", "capacity": 1, "lease_length": "soon"}]}`,
		`{"resources": []} {}`,
		`nope`,
	} {
		if _, err := ParseConfig([]byte(bad)); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("ParseConfig(%s) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestLearningStaysWithinCapacity(t *testing.T) {
	s, clk := newTestServer(t, testConfig(100))
	// Clients report what an earlier master gave them; one overclaims.
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 60, Has: 50}); g[0].Capacity != 50 {
		t.Fatalf("a got %v, want its 50", g[0].Capacity)
	}
	if g := ask(t, s, "new", ResourceRequest{Resource: "r", Wants: 60}); g[0].Capacity != 0 {
		t.Fatalf("newcomer got %v while learning", g[0].Capacity)
	}
	if g := ask(t, s, "liar", ResourceRequest{Resource: "r", Wants: 90, Has: 90}); g[0].Capacity != 50 {
		t.Fatalf("overclaiming client got %v, want the 50 unclaimed", g[0].Capacity)
	}
	if g := ask(t, s, "small", ResourceRequest{Resource: "r", Wants: 5, Has: 30}); g[0].Capacity != 0 {
		t.Fatalf("got %v with nothing unclaimed", g[0].Capacity)
	}
	// The grants add up to 100; what the clients said they hold counts
	// in full, confirmed or not, until they report less or their leases
	// expire: a 50, the liar 90, small 30.
	if h := held(s, "r"); h != 170 {
		t.Fatalf("held %v, want 170: all that the clients say they hold", h)
	}
	if st := s.Status(); !st.Resources[0].Learning {
		t.Fatal("not learning")
	}
	clk.Advance(20 * time.Second) // learning over; the leases above expire now too
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 60, Has: 50})
	if st := s.Status(); st.Resources[0].Learning {
		t.Fatal("still learning")
	}
}

// settle runs refresh rounds until the grants stop changing.
func settle(t *testing.T, s *Server, clk *throttletest.Clock, wants map[string]float64) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	last := held(s, "r")
	for range 6 {
		for _, c := range []string{"a", "b", "c", "d", "e"} {
			w, ok := wants[c]
			if !ok {
				continue
			}
			got[c] = ask(t, s, c, ResourceRequest{Resource: "r", Wants: w, Has: got[c]})[0].Capacity
			// Above capacity only while leases from before a lowering
			// remain, and then never growing.
			if h := held(s, "r"); h > s.cfg.Resources[0].Capacity && h > last {
				t.Fatalf("held %v > capacity and grew from %v", h, last)
			}
			last = held(s, "r")
		}
		clk.Advance(time.Second)
	}
	return got
}

// counts is how long a lease of length lease counts at its server: its
// length and the grace for a server clock running fast.
func counts(lease time.Duration) time.Duration {
	return lease + time.Duration(skewGrace(lease))
}

func pastLearning(t *testing.T, capacity float64) (*Server, *throttletest.Clock) {
	s, clk := newTestServer(t, testConfig(capacity))
	clk.Advance(20 * time.Second)
	return s, clk
}

func TestDesignExample(t *testing.T) {
	s, clk := pastLearning(t, 120)
	got := settle(t, s, clk, map[string]float64{"a": 1000, "b": 50, "c": 10})
	if got["a"] != 60 || got["b"] != 50 || got["c"] != 10 {
		t.Fatalf("got %v, want a 60, b 50, c 10", got)
	}
}

func TestGrantWaitsForOthersToRelease(t *testing.T) {
	s, clk := pastLearning(t, 100)
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 100 {
		t.Fatalf("a alone got %v", g[0].Capacity)
	}
	clk.Advance(5 * time.Second)
	g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100})
	if g[0].Capacity != 0 {
		t.Fatalf("b got %v while a holds everything", g[0].Capacity)
	}
	if g[0].Refresh > 2*time.Second {
		t.Fatalf("a waiting client should refresh sooner, got %v", g[0].Refresh)
	}
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 100}); g[0].Capacity != 50 {
		t.Fatalf("a got %v at refresh, want its share 50", g[0].Capacity)
	}
	// Until a's lowered lease has reached it, a may still use 100: for as
	// long as its old lease lasts (20s from t=0), however late the answer.
	for range 14 {
		if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 0 {
			t.Fatalf("b got %v while a's lower lease is on its way", g[0].Capacity)
		}
		if held(s, "r") != 100 {
			t.Fatalf("held %v, want a's old 100", held(s, "r"))
		}
		// a's refresh says it still has 100: the answer never arrived.
		ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 100})
		clk.Advance(time.Second)
	}
	clk.Advance(time.Second) // a's old lease expires at t=20s
	// a's last refresh said it still used 100 (a gauge's units in flight
	// outlive a lease): that counts until a says less, or until the lease
	// granted then has expired.
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 0 {
		t.Fatalf("b got %v while a may still use 100", g[0].Capacity)
	}
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100}) // its old lease expired: a holds nothing
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 50 {
		t.Fatalf("b got %v after a's old lease expired, want 50", g[0].Capacity)
	}
}

func TestLoweredLeaseConfirmedByRefresh(t *testing.T) {
	s, _ := pastLearning(t, 100)
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100})
	ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100})
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 100}) // lowered to 50
	// a confirms it holds 50: its old lease stops counting at once.
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 50})
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 50 {
		t.Fatalf("b got %v after a confirmed its lower lease, want 50", g[0].Capacity)
	}
}

// TestLoweredLeaseOutlivesShorterGrant: a lease lowered under a shorter
// lease length still counts at its old size until the old lease expires,
// after the shorter grant has expired.
func TestLoweredLeaseOutlivesShorterGrant(t *testing.T) {
	s, clk := pastLearning(t, 100)
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100}) // 100 for 20s
	ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100})
	cfg := testConfig(100)
	cfg.Resources[0].LeaseLength, cfg.Resources[0].RefreshInterval = 2*time.Second, time.Second
	cfg.Resources[0].MaxLeaseLength = 20 * time.Second
	if err := s.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 100}) // 50 for 2s; the answer is lost
	clk.Advance(10 * time.Second)
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 0 {
		t.Fatalf("b got %v while a may still hold its old 100", g[0].Capacity)
	}
	clk.Advance(counts(20*time.Second) - 10*time.Second)
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 100 {
		t.Fatalf("b got %v after a's old lease expired, want 100", g[0].Capacity)
	}
}

// TestAbandonedRequestChangesNothing: a request whose caller gave up (its
// context done) before the server got to it may be older than the
// caller's next one; applied, its Has of 0 would confirm a lowered lease
// the caller never got.
func TestAbandonedRequestChangesNothing(t *testing.T) {
	s, _ := pastLearning(t, 100)
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100})
	ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100})
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100, Has: 100}) // lowered to 50, answer lost
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stale := &Request{Client: "a", Resources: []ResourceRequest{{Resource: "r", Wants: 100}}} // sent before a held anything
	if _, err := s.GetCapacity(ctx, stale); !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned request: %v", err)
	}
	if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 0 {
		t.Fatalf("b got %v: an abandoned request confirmed a's lower lease", g[0].Capacity)
	}
}

func TestExpiredClientsShareGoesToOthers(t *testing.T) {
	s, clk := pastLearning(t, 100)
	settle(t, s, clk, map[string]float64{"a": 100, "b": 100})
	clk.Advance(21 * time.Second) // b dies; a keeps refreshing below
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 100 {
		t.Fatalf("a got %v after b's lease expired, want 100", g[0].Capacity)
	}
}

func TestReleaseFreesAtOnce(t *testing.T) {
	s, clk := pastLearning(t, 100)
	settle(t, s, clk, map[string]float64{"a": 100, "b": 100})
	if _, err := s.Release(context.Background(), &ReleaseRequest{Client: "b", Resources: []string{"r", "unknown"}}); err != nil {
		t.Fatal(err)
	}
	if g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 100}); g[0].Capacity != 100 {
		t.Fatalf("a got %v after b released", g[0].Capacity)
	}
}

func TestConfigLowered(t *testing.T) {
	s, clk := pastLearning(t, 100)
	settle(t, s, clk, map[string]float64{"a": 100, "b": 100})
	if err := s.SetConfig(testConfig(40)); err != nil {
		t.Fatal(err)
	}
	got := settle(t, s, clk, map[string]float64{"a": 100, "b": 100})
	if got["a"] != 20 || got["b"] != 20 {
		t.Fatalf("after lowering: %v", got)
	}
	if err := s.SetConfig(Config{}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("empty config: %v", err)
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	s, _ := pastLearning(t, 100)
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 30})
	before := s.Status()
	many := make([]ResourceRequest, maxRequestResources+1)
	for i := range many {
		many[i] = ResourceRequest{Resource: "x" + strings.Repeat("y", i%3), Wants: 1}
	}
	for name, req := range map[string]*Request{
		"nil":          nil,
		"empty client": {Resources: []ResourceRequest{{Resource: "r", Wants: 1}}},
		"long client":  {Client: strings.Repeat("c", maxIDLen+1), Resources: []ResourceRequest{{Resource: "r", Wants: 1}}},
		"no resources": {Client: "b"},
		"too many":     {Client: "b", Resources: many},
	} {
		if _, err := s.GetCapacity(context.Background(), req); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	// A request whose every resource is bad refuses each, and changes
	// nothing either.
	for name, rr := range badResources() {
		resp, err := s.GetCapacity(context.Background(), &Request{Client: "b", Resources: []ResourceRequest{rr}})
		if err != nil || len(resp.Grants) != 1 || !errors.Is(resp.Grants[0].Err, ErrResourceRefused) || !errors.Is(resp.Grants[0].Err, throttle.ErrInvalid) {
			t.Errorf("%s: %+v, %v; want the resource refused as invalid", name, resp, err)
		}
	}
	for name, req := range map[string]*ReleaseRequest{"nil": nil, "empty client": {Resources: []string{"r"}}} {
		if _, err := s.Release(context.Background(), req); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("release %s: err = %v, want ErrInvalid", name, err)
		}
	}
	if after := s.Status(); len(after.Resources) != len(before.Resources) || after.Resources[0] != before.Resources[0] {
		t.Fatalf("state changed: %+v -> %+v", before, after)
	}
}

// badResources are demands a server refuses, each on its own.
func badResources() map[string]ResourceRequest {
	return map[string]ResourceRequest{
		"NaN wants":   {Resource: "s", Wants: math.NaN()},
		"Inf wants":   {Resource: "r", Wants: math.Inf(1)},
		"max wants":   {Resource: "r", Wants: math.MaxFloat64, Has: math.Inf(1)},
		"neg wants":   {Resource: "r", Wants: -1},
		"neg has":     {Resource: "r", Wants: 1, Has: -1},
		"NaN weight":  {Resource: "r", Wants: 1, Weight: math.NaN()},
		"huge weight": {Resource: "r", Wants: 1, Weight: 1e9},
		"empty id":    {Wants: 1},
		"long id":     {Resource: strings.Repeat("r", maxIDLen+1), Wants: 1},
	}
}

// TestOneBadResourceServesTheOthers: a request with bad resources among
// good ones gets the good ones granted and each bad one refused with an
// error of its own.
func TestOneBadResourceServesTheOthers(t *testing.T) {
	s, _ := pastLearning(t, 100)
	for name, bad := range badResources() {
		good := ResourceRequest{Resource: "r", Wants: 10}
		if bad.Resource == "r" {
			bad.Resource = "bad"
		}
		resp, err := s.GetCapacity(context.Background(), &Request{Client: "a", Resources: []ResourceRequest{bad, good, good}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		g := resp.Grants
		if len(g) != 3 || g[1].Err != nil || g[1].Capacity != 10 || g[0].Capacity != 0 || g[0].Lease != 0 || g[0].Resource != bad.Resource {
			t.Fatalf("%s: grants %+v", name, g)
		}
		for _, i := range []int{0, 2} { // the bad one, and the second "good"
			if !errors.Is(g[i].Err, ErrResourceRefused) || !errors.Is(g[i].Err, throttle.ErrInvalid) || errors.Is(g[i].Err, ErrExhausted) {
				t.Errorf("%s: grant %d: err %v, want ErrResourceRefused and ErrInvalid", name, i, g[i].Err)
			}
		}
	}
	if st := s.Status(); len(st.Resources) != 1 || st.Resources[0].ID != "r" {
		t.Fatalf("bad resources left state: %+v", st)
	}
}

func TestBounds(t *testing.T) {
	s, _ := newTestServer(t, testConfig(100), WithMaxClients(2), WithMaxResources(2))
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 1})
	ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 1})
	// The resource at its bound of clients is refused, the other served.
	resp, err := s.GetCapacity(context.Background(), &Request{Client: "c", Resources: []ResourceRequest{{Resource: "r", Wants: 1}, {Resource: "s", Wants: 1}}})
	if err != nil || !errors.Is(resp.Grants[0].Err, ErrExhausted) || !errors.Is(resp.Grants[0].Err, ErrResourceRefused) || resp.Grants[1].Err != nil || resp.Grants[1].Lease == 0 {
		t.Fatalf("third client: %+v, %v", resp, err)
	}
	ask(t, s, "a", ResourceRequest{Resource: "s", Wants: 1})
	if _, err := s.GetCapacity(context.Background(), &Request{Client: "a", Resources: []ResourceRequest{{Resource: "t", Wants: 1}}}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("third resource: %v", err)
	}
	if n := len(s.Status().Resources); n != 2 {
		t.Fatalf("%d resources", n)
	}
	for _, o := range []ServerOption{WithMaxClients(0), WithJitter(1), WithJitter(math.NaN())} {
		if _, err := NewServer(testConfig(1), o); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("bad option: %v", err)
		}
	}
}

func TestJitter(t *testing.T) {
	s, _ := pastLearning(t, 100)
	seen := map[time.Duration]bool{}
	for range 20 {
		g := ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 10})[0]
		if g.Refresh < 4500*time.Millisecond || g.Refresh > 5500*time.Millisecond || g.Lease != 20*time.Second {
			t.Fatalf("grant %+v", g)
		}
		seen[g.Refresh] = true
	}
	if len(seen) < 10 {
		t.Fatalf("refresh intervals not spread: %v", seen)
	}
}

// TestRandomOperationsStayWithinCapacity drives a server with random
// requests, releases, expiries and configuration changes, checking after
// every step that the leases held add up to no more than the capacity.
func TestRandomOperationsStayWithinCapacity(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	s, clk := newTestServer(t, testConfig(100))
	capacity := 100.0
	has := map[string]float64{}
	last := 0.0
	for step := range 3000 {
		c := string(rune('a' + r.IntN(12)))
		switch r.IntN(10) {
		case 0:
			clk.Advance(time.Duration(r.IntN(8000)) * time.Millisecond)
		case 1:
			s.Release(context.Background(), &ReleaseRequest{Client: c, Resources: []string{"r"}})
			has[c] = 0
		case 2:
			capacity = []float64{100, 37.5, 1e6, 0.001, 250}[r.IntN(5)]
			if err := s.SetConfig(testConfig(capacity)); err != nil {
				t.Fatal(err)
			}
			continue // leases given under the old capacity may exceed the new
		default:
			g := ask(t, s, c, ResourceRequest{Resource: "r", Wants: r.Float64() * capacity, Has: has[c] * 1.5, Priority: int32(r.IntN(2)), Weight: float64(1 + r.IntN(3))})
			has[c] = g[0].Capacity
		}
		// Above capacity only while leases from before a lowering
		// remain, and then never growing; while the server learns, what
		// the clients (lying by half) say they hold counts too.
		if h := held(s, "r"); h > capacity && h > last && !s.Status().Resources[0].Learning {
			t.Fatalf("step %d: held %v > capacity %v and grew from %v", step, h, capacity, last)
		}
		last = held(s, "r")
	}
}

// fakeElection reports ls, closes reported (if not nil), and waits.
type fakeElection struct {
	ls       []Leadership
	reported chan struct{}
}

func (f fakeElection) Campaign(ctx context.Context, _ string, report func(Leadership)) error {
	for _, l := range f.ls {
		report(l)
	}
	if f.reported != nil {
		close(f.reported)
	}
	<-ctx.Done()
	return nil
}

func TestRedirectAndNewMasterLearns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := pastLearning(t, 100)
		ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 10})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx, fakeElection{ls: []Leadership{{Master: "other:1", Term: 2}}}, "me:1") }()
		synctest.Wait()
		resp, err := s.GetCapacity(context.Background(), &Request{Client: "a", Resources: []ResourceRequest{{Resource: "r", Wants: 10}}})
		if err != nil || !resp.Redirect || resp.Master != "other:1" || len(resp.Grants) != 0 {
			t.Fatalf("not master: %+v, %v", resp, err)
		}
		if resp, _ := s.Release(context.Background(), &ReleaseRequest{Client: "a"}); !resp.Redirect {
			t.Fatal("release not redirected")
		}
		cancel()
		<-done

		s2, _ := pastLearning(t, 100)
		ctx, cancel = context.WithCancel(context.Background())
		go func() { done <- s2.Run(ctx, Solo{}, "me:1") }()
		synctest.Wait()
		if st := s2.Status(); st.Leadership.Master != "me:1" {
			t.Fatalf("leadership %+v", st.Leadership)
		}
		if g := ask(t, s2, "a", ResourceRequest{Resource: "r", Wants: 10}); g[0].Capacity != 0 {
			t.Fatalf("new master granted %v to a newcomer while learning", g[0].Capacity)
		}
		cancel()
		<-done
		if st := s2.Status(); st.Leadership.IsMaster {
			t.Fatal("still master after Run returned")
		}
	})
}

// TestRegainSameTermKeepsState: a master that loses mastership and
// regains it in the same term (no other master in between) keeps its
// leases and does not learn again.
func TestRegainSameTermKeepsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewServer(testConfig(100))
		if err != nil {
			t.Fatal(err)
		}
		e := &testElection{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		e.set(Leadership{Master: "me", Term: 2})
		go s.Run(ctx, e, "me")
		synctest.Wait()
		time.Sleep(20 * time.Second) // learns
		ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 60})
		e.set(Leadership{Term: 2}) // lost, no master known
		if resp, _ := s.GetCapacity(ctx, &Request{Client: "b", Resources: []ResourceRequest{{Resource: "r", Wants: 60}}}); !resp.Redirect {
			t.Fatal("granted while not master")
		}
		e.set(Leadership{Master: "me", Term: 2})
		if g := ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 60}); g[0].Capacity != 40 {
			t.Fatalf("b got %v after the same term came back, want 40 beside a's 60", g[0].Capacity)
		}
		e.set(Leadership{Master: "me", Term: 3}) // another master may have been in between
		if g := ask(t, s, "c", ResourceRequest{Resource: "r", Wants: 60}); g[0].Capacity != 0 {
			t.Fatalf("c got %v from a master learning in a new term", g[0].Capacity)
		}
		cancel()
	})
}

// TestCatchAllMatchesEverything: the required "*" template serves every
// resource id, also one with a "/" (path.Match's "*" stops at "/"), after
// exact ids and the other patterns.
func TestCatchAllMatchesEverything(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"resources": [{"id": "db/*", "capacity": 5}, {"id": "*", "capacity": 9}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]float64{"db/x": 5, "api/v1/users": 9, "plain": 9, "db/x/y": 9} {
		if tm, ok := cfg.match(id); !ok || tm.Capacity != want {
			t.Errorf("match(%q) = %v, %v; want capacity %v", id, tm.Capacity, ok, want)
		}
	}
}
