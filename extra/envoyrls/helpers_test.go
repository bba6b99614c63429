package envoyrls

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeClock is a settable clock for Options.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	// 10 s into a day, so that no window of a unit up to a day ends
	// during a test that does not move the clock.
	return &fakeClock{t: time.Unix(1_800_000_000-1_800_000_000%86400+10, 0)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// readResponse is the status and body of an HTTP response, or fails t
// with err.
func readResponse(t testing.TB, resp *http.Response, err error) (int, string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mustParse parses one YAML document named name.
func mustParse(t testing.TB, name, yaml string) *Config {
	t.Helper()
	cfg, err := parse([]configFile{{Name: name, Data: []byte(yaml)}}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// serveGRPC serves svc on a loopback port and returns a go-control-plane
// client connected to it over real gRPC.
func serveGRPC(t testing.TB, svc *Service) (rlsv3.RateLimitServiceClient, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := newGRPCServer()
	svc.Register(g)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), ln.Addr().String()
}

// rig is a service on a fake clock behind a real gRPC client.
type rig struct {
	t      testing.TB
	clock  *fakeClock
	svc    *Service
	client rlsv3.RateLimitServiceClient
	addr   string // the gRPC listener's
}

func newRig(t testing.TB, yaml string, o Options) *rig {
	t.Helper()
	r := &rig{t: t, clock: newFakeClock()}
	o.Now = r.clock.Now
	mem := NewMemory(0)
	t.Cleanup(func() { mem.Close() })
	if o.Backend == nil {
		o.Backend = mem
	}
	r.svc = newService(mustParse(t, "test.yaml", yaml), o)
	r.client, r.addr = serveGRPC(t, r.svc)
	return r
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// ask sends one request and fails the test on an error.
func (r *rig) ask(domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	r.t.Helper()
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// admitted sends n requests of one descriptor and counts the OK answers.
func (r *rig) admitted(n int, domain string, kv ...string) int {
	r.t.Helper()
	ok := 0
	for range n {
		if r.ask(domain, desc(kv...)).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

type (
	rlv3Desc     = rlv3.RateLimitDescriptor
	rlv3Override = rlv3.RateLimitDescriptor_RateLimitOverride
)

func req(domain string, ds ...*rlv3Desc) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// wantAdmitted sends n requests of one descriptor and reports an error,
// naming what, unless want of them are admitted.
func (r *rig) wantAdmitted(what string, want, n int, domain string, kv ...string) {
	r.t.Helper()
	if got := r.admitted(n, domain, kv...); got != want {
		r.t.Errorf("%s: %d of %d admitted, want %d", what, got, n, want)
	}
}

// wantOneHit reports an error for each metric key that did not count
// exactly one hit.
func (r *rig) wantOneHit(keys ...string) {
	r.t.Helper()
	for _, k := range keys {
		if n := r.svc.metrics.stats(k).total.Load(); n != 1 {
			r.t.Errorf("metric key %s: %d hits, want 1", k, n)
		}
	}
}
