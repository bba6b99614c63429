package envoyrls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/throttlekit/throttle/internal/envoyreftest"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// startReference runs the reference (see envoyreftest) with the
// response headers on, and returns a client of its gRPC API once it
// answers.
func startReference(t *testing.T, yaml, redisAddr string) rlsv3.RateLimitServiceClient {
	addr := envoyreftest.Start(t, envoyreftest.Binary(t), yaml, redisAddr, "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	testproc.Eventually(t, 10*time.Second, func() bool {
		_, err := c.ShouldRateLimit(context.Background(), req("warmup", desc("k", "v")))
		return err == nil
	})
	return c
}

// compareConfig exercises every behaviour of the reference's
// configuration at once, in minute and hour windows (edges are avoided).
const compareConfig = `
domain: cmp
descriptors:
  - key: database
    value: users
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: database
    rate_limit: {unit: minute, requests_per_unit: 32}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: hour, requests_per_unit: 36}
  - key: to_number
    rate_limit: {unit: hour, requests_per_unit: 56}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 20}
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 40}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific, unit: minute, requests_per_unit: 32}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: specific}]
          unit: minute
          requests_per_unit: 48
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 64}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 32}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 24}
`

// pool are the descriptors the compared stream draws from.
var pool = [][]string{
	{"database", "users"}, {"database", "default"}, {"database", "other"}, {"database", "more"},
	{"message_type", "marketing", "to_number", "1"}, {"message_type", "marketing", "to_number", "2"},
	{"message_type", "marketing", "to_number", "3"}, {"to_number", "1"}, {"to_number", "2"}, {"to_number", "3"},
	{"message_type", "marketing"},
	{"remote_address", "50.0.0.5"}, {"remote_address", "50.0.0.1"}, {"ldap", "x"},
	{"service", "s", "user", "user-a"}, {"service", "s", "user", "user-b"}, {"service", "t", "user", "user-c"},
	{"key_1", "value_1", "user", "u"}, {"key_2", "value_2", "user", "u"},
	{"files", "files/a"}, {"files", "files/b"}, {"files", "files/"}, {"files", "nofiles"},
	{"path", "/api/1/action"}, {"path", "/api/2/action"}, {"path", "/api/1/other"},
	{"quota", "q"}, {"unknown", "x"},
}

// randomRequest draws a request: 1 to 4 descriptors, varied hits_addend,
// per-descriptor hits_addend and limit overrides now and then.
func randomRequest(rng *rand.Rand) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "cmp", HitsAddend: []uint32{0, 1, 1, 1, 2, 3}[rng.IntN(6)]}
	if rng.IntN(40) == 0 {
		r.Domain = "nodomain"
	}
	for range 1 + rng.IntN(4) {
		d := desc(pool[rng.IntN(len(pool))]...)
		switch rng.IntN(20) {
		case 0:
			d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3)))
		case 1:
			d.Limit = &rlv3Override{RequestsPerUnit: uint32(1 + rng.IntN(3)), Unit: typev3.RateLimitUnit_MINUTE}
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// awayFromEdge waits, when a minute ends within two seconds, for the
// next one to begin, so that both services count a request in the same
// window.
func awayFromEdge() {
	if s := time.Now().Unix() % 60; s >= 58 {
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute + 200*time.Millisecond)))
	}
}

// sameResponse compares two answers field by field: codes, limits,
// remaining and headers exactly, durations within a second.
func sameResponse(a, b *rlsv3.RateLimitResponse) error {
	if a.OverallCode != b.OverallCode || len(a.Statuses) != len(b.Statuses) || len(a.ResponseHeadersToAdd) != len(b.ResponseHeadersToAdd) {
		return fmt.Errorf("overall %v / %v, %d / %d statuses, %d / %d headers", a.OverallCode, b.OverallCode,
			len(a.Statuses), len(b.Statuses), len(a.ResponseHeadersToAdd), len(b.ResponseHeadersToAdd))
	}
	for i, x := range a.Statuses {
		y := b.Statuses[i]
		if x.Code != y.Code || x.LimitRemaining != y.LimitRemaining ||
			x.GetCurrentLimit().GetRequestsPerUnit() != y.GetCurrentLimit().GetRequestsPerUnit() ||
			x.GetCurrentLimit().GetUnit() != y.GetCurrentLimit().GetUnit() || x.GetCurrentLimit().GetName() != y.GetCurrentLimit().GetName() ||
			(x.CurrentLimit == nil) != (y.CurrentLimit == nil) ||
			absDiff(x.GetDurationUntilReset().AsDuration(), y.GetDurationUntilReset().AsDuration()) > time.Second {
			return fmt.Errorf("status %d: %v / %v", i, x, y)
		}
	}
	for i, h := range a.ResponseHeadersToAdd {
		g := b.ResponseHeadersToAdd[i]
		if h.Key != g.Key || (h.Value != g.Value && h.Key != "RateLimit-Reset") {
			return fmt.Errorf("header %d: %v / %v", i, h, g)
		}
	}
	return nil
}

func absDiff(a, b time.Duration) time.Duration { return max(a-b, b-a) }

// The same stream of requests to the reference (on Redis) and to this
// service in fixed-window mode (in process, and on the same Redis):
// every answer the same, decision by decision.
func TestSideBySideWithReference(t *testing.T) {
	srv := redistest.Start(t)
	ref := startReference(t, compareConfig, srv.Addr)
	rc := redisClient(t, &redis.Options{Addr: srv.Addr})
	mem := newRig(t, compareConfig, Options{ResponseHeaders: true})
	onRedis := newRig(t, compareConfig, Options{ResponseHeaders: true, KeyPrefix: "ours_", Backend: newRedisBackend(t, rc, false, time.Second)})
	mem.svc.o.Now, onRedis.svc.o.Now = time.Now, time.Now
	rng := rand.New(rand.NewPCG(42, 7))
	limited := map[rlsv3.RateLimitResponse_Code]int{}
	const n = 600
	for i := range n {
		awayFromEdge()
		r := randomRequest(rng)
		want, err := ref.ShouldRateLimit(t.Context(), r)
		if err != nil {
			t.Fatalf("request %d to the reference: %v", i, err)
		}
		for name, c := range map[string]rlsv3.RateLimitServiceClient{"in process": mem.client, "redis": onRedis.client} {
			got, err := c.ShouldRateLimit(t.Context(), r)
			if err != nil {
				t.Fatalf("request %d (%s): %v", i, name, err)
			}
			if err := sameResponse(want, got); err != nil {
				t.Fatalf("request %d (%s) %v: reference / ours differ: %v\nreference: %v\nours: %v", i, name, r, err, want, got)
			}
		}
		for _, st := range want.Statuses {
			if st.CurrentLimit != nil {
				limited[st.Code]++
			}
		}
	}
	t.Logf("%d requests, every answer the same; descriptors with a limit: %d OK, %d OVER_LIMIT", n, limited[codeOK], limited[codeOver])
	if limited[codeOK] < n/4 || limited[codeOver] < n/4 {
		t.Errorf("the stream tests too few decisions of one kind")
	}
}
