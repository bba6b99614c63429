package envoyrls

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/throttlekit/throttle"
)

// Concurrent requests on one key of the in-process backend: each window
// admits exactly the limit, sampled from the clients' answers.
func TestMemoryFixedWindowExactUnderConcurrency(t *testing.T) {
	clock := newFakeClock()
	svc := newService(mustParse(t, "f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), Options{Now: clock.Now})
	for window := range 3 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := 0
		for range 8 {
			wg.Go(func() {
				for range 50 {
					resp, err := svc.decide(context.Background(), req("d", desc("k", "v")))
					if err != nil {
						t.Error(err)
						return
					}
					if resp.OverallCode == codeOK {
						mu.Lock()
						ok++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if ok != 100 {
			t.Errorf("window %d: %d admitted of 400, want 100", window, ok)
		}
		clock.Add(time.Second)
	}
}

// Expired counters are swept; a key charged again gets a fresh window.
func TestMemorySweep(t *testing.T) {
	m := NewMemory(0)
	defer m.Close()
	l := &limitRule{rlUnit: unitSecond, RequestsPerUnit: 1}
	now := time.Unix(1000, 0)
	out := make([]outcome, 1)
	for i := range 100 {
		if err := m.charge(context.Background(), now, []hit{{Key: string(rune('a' + i%26)), Limit: l, N: 1}}, out); err != nil {
			t.Fatal(err)
		}
	}
	if m.size() != 26 {
		t.Fatalf("%d keys, want 26", m.size())
	}
	now = now.Add(sweepEvery + time.Second)
	m.charge(context.Background(), now, []hit{{Key: "a", Limit: l, N: 1}}, out)
	if m.size() != 1 || out[0].Over || out[0].After != 1 {
		t.Errorf("after the sweep: %d keys, outcome %+v", m.size(), out[0])
	}
}

// The algorithms beyond the reference keep their bounds over the RLS
// API across a window edge: the fixed window admits twice the limit
// within 2 ms, the sliding window and log the limit only, a token bucket
// its burst, then its rate.
func TestAlgorithmsOverTheAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := newService(mustParse(t, "f.yaml", `
domain: d
descriptors:
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 5}
  - key: window
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_log}
`), Options{})
		defer svc.o.Backend.(*Memory).Close()
		ask := func(key string, n int) int {
			ok := 0
			for range n {
				resp, err := svc.decide(context.Background(), req("d", desc(key, "x")))
				if err != nil {
					t.Fatal(err)
				}
				if resp.OverallCode == codeOK {
					ok++
				}
			}
			return ok
		}
		// Across a window edge: 10 just before it, 10 just after.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second - time.Millisecond)))
		got := map[string]int{}
		for _, k := range []string{"fixed", "bucket", "window", "log"} {
			got[k] = ask(k, 10)
		}
		time.Sleep(2 * time.Millisecond)
		for _, k := range []string{"fixed", "bucket", "window", "log"} {
			got[k] += ask(k, 10)
		}
		want := map[string]int{"fixed": 20, "bucket": 5, "window": 10, "log": 10}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s: %d admitted within 2 ms across an edge, want %d", k, got[k], w)
			}
		}
		time.Sleep(time.Second)
		if n := ask("bucket", 20); n != 5 {
			t.Errorf("bucket after a second: %d, want its burst 5", n)
		}
	})
}

// A failing backend fails the request with Unavailable, or answers OK
// with FailOpen.
func TestBackendDown(t *testing.T) {
	down := backendFunc(func(context.Context, time.Time, []hit, []outcome) error { return throttle.ErrUnavailable })
	cfg := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	r := newRig(t, cfg, Options{Backend: down})
	_, err := r.client.ShouldRateLimit(t.Context(), req("d", desc("k", "v")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: %v", err)
	}
	open := newRig(t, cfg, Options{Backend: down, FailOpen: true})
	if resp := open.ask("d", desc("k", "v"), desc("k", "w")); resp.OverallCode != codeOK || len(resp.Statuses) != 2 {
		t.Errorf("fail open: %v", resp)
	}
	_, err = r.client.ShouldRateLimit(t.Context(), req("", desc("k", "v")))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("no domain: %v", err)
	}
	if _, err := r.svc.decide(t.Context(), req("d")); !errors.Is(err, ErrBadRequest) {
		t.Errorf("no descriptor: %v", err)
	}
}

type backendFunc func(context.Context, time.Time, []hit, []outcome) error

func (f backendFunc) charge(ctx context.Context, now time.Time, h []hit, o []outcome) error {
	return f(ctx, now, h, o)
}

// The global shadow mode answers OK and keeps the statuses' codes.
func TestGlobalShadowMode(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0}\n", Options{ShadowMode: true})
	resp := r.ask("d", desc("k", "v"))
	if resp.OverallCode != codeOK || resp.Statuses[0].Code != codeOver {
		t.Errorf("global shadow: %v", resp)
	}
}

// The HTTP endpoints: /json answers 200 or 429 with the JSON response,
// 400 for a bad body; /healthcheck; /metrics.
func TestHTTPEndpoints(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", Options{})
	healthy := true
	srv := httptest.NewServer(r.svc.Handler(func() bool { return healthy }))
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
		return readResponse(t, resp, err)
	}
	body := `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	if code, out := post(body); code != 200 || !strings.Contains(out, `"overallCode":"OK"`) {
		t.Errorf("first: %d %s", code, out)
	}
	if code, out := post(body); code != 429 || !strings.Contains(out, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("second: %d %s", code, out)
	}
	if code, _ := post(`{"domain": 1}`); code != 400 {
		t.Errorf("bad body: %d", code)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		return readResponse(t, resp, err)
	}
	if code, out := get("/healthcheck"); code != 200 || out != "OK" {
		t.Errorf("healthcheck: %d %q", code, out)
	}
	healthy = false
	if code, _ := get("/healthcheck"); code != 500 {
		t.Errorf("unhealthy: %d", code)
	}
	if code, out := get("/metrics"); code != 200 || !strings.Contains(out, `envoyrls_over_limit_total{key="d.k"} 1`) {
		t.Errorf("metrics: %d %s", code, out)
	}
}

// The metric series are capped: keys past the cap are counted under _other.
func TestMetricSeriesBounded(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", Options{MaxMetricSeries: 3})
	for _, v := range []string{"a", "b", "c", "d", "e"} {
		r.ask("d", desc("k", v))
	}
	var b strings.Builder
	r.svc.writeMetrics(&b)
	if n := strings.Count(b.String(), "envoyrls_hits_total{"); n != 4 {
		t.Errorf("%d hit series, want 3 and _other:\n%s", n, b.String())
	}
	if !strings.Contains(b.String(), `envoyrls_hits_total{key="_other"} 2`) {
		t.Errorf("_other:\n%s", b.String())
	}
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// A limit override with a minute unit on the same entries as an hourly
// rule counts apart from it, as in the reference, whose keys carry the
// window start (the in-process backend once kept one counter per entries
// and let the override's window replace the rule's).
func TestOverrideCountsApartFromRule(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n", Options{})
	r.clock.Add(2 * time.Minute) // the minute and the hour windows start apart
	if got := r.admitted(3, "d", "k", "v"); got != 3 {
		t.Fatalf("rule: %d admitted, want 3", got)
	}
	over := desc("k", "v")
	over.Limit = &rlv3Override{RequestsPerUnit: 5, Unit: 2}
	if st := r.ask("d", over).Statuses[0]; st.Code != codeOK || st.LimitRemaining != 4 {
		t.Errorf("override: %v, want OK with 4 remaining", st)
	}
	if got := r.admitted(1, "d", "k", "v"); got != 0 {
		t.Errorf("the hourly rule was reset by the override's minute window: %d admitted, want 0", got)
	}
}

// Past its key cap the in-process backend counts new keys of a rule in one
// shared counter: they stay limited, and the counters stay bounded.
func TestMemoryMaxKeys(t *testing.T) {
	mem := NewMemory(3)
	defer mem.Close()
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n", Options{Backend: mem})
	for _, v := range []string{"a", "b", "c"} {
		if got := r.admitted(3, "d", "k", v); got != 2 {
			t.Errorf("%s: %d admitted, want 2", v, got)
		}
	}
	if got := r.admitted(3, "d", "k", "x") + r.admitted(3, "d", "k", "y"); got != 2 {
		t.Errorf("two keys past the cap: %d admitted, want 2 (one shared counter)", got)
	}
	if mem.size() != 4 {
		t.Errorf("%d counters, want 3 and the overflow", mem.size())
	}
}

// A raw call by the method's full name, with the request written in
// JSON as grpcurl takes it.
func TestRawGRPCCall(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", Options{})
	var in rlsv3.RateLimitRequest
	if err := protojson.Unmarshal([]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":2}`), &in); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var out rlsv3.RateLimitResponse
	if err := conn.Invoke(t.Context(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &in, &out); err != nil {
		t.Fatal(err)
	}
	if b, _ := protojson.Marshal(&out); !strings.Contains(string(b), `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("2 hits over a limit of 1: %s", b)
	}
}

// The metrics split a rule's hits as the reference does: within the
// limit, past the near-limit ratio (80%), over it.
func TestMetricsNearAndOver(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", Options{})
	r.admitted(9, "d", "k", "v")
	r.ask("d", withHits(desc("k", "v"), 3)) // 9 → 12: one within, two over
	st := r.svc.metrics.stats("d.k")
	if st.total.Load() != 12 || st.within.Load() != 9 || st.near.Load() != 2 || st.over.Load() != 2 {
		t.Errorf("total %d within %d near %d over %d, want 12, 9, 2, 2",
			st.total.Load(), st.within.Load(), st.near.Load(), st.over.Load())
	}
}

// More hits than a token bucket holds are OVER_LIMIT, not an error; 0 hits
// are answered OK without a charge.
func TestBucketHitsAboveBurst(t *testing.T) {
	r := newRig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n", Options{})
	if st := r.ask("d", withHits(desc("k", "v"), 6)).Statuses[0]; st.Code != codeOver {
		t.Errorf("6 hits on a burst of 5: %v", st)
	}
	if st := r.ask("d", withHits(desc("k", "v"), 0)).Statuses[0]; st.Code != codeOK {
		t.Errorf("0 hits: %v", st)
	}
	if got := r.admitted(6, "d", "k", "v"); got != 5 {
		t.Errorf("then %d admitted, want the whole burst 5", got)
	}
}
