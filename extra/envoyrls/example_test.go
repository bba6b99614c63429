package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle/distributed/gossip"
	"github.com/throttlekit/throttle/extra/envoyrls"
)

// configDir writes one file of the reference's YAML into a new directory.
func configDir(yaml string) string {
	dir, err := os.MkdirTemp("", "envoyrls-example")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o600); err != nil {
		panic(err)
	}
	return dir
}

const exampleYAML = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// request asks about one descriptor of the "edge" domain.
func request(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}

// Embedding the service in a program: the reference's YAML, the gRPC
// service Envoy calls, the HTTP endpoints, and hot reload.
func Example() {
	dir := configDir(exampleYAML)
	defer os.RemoveAll(dir)
	svc, src, err := envoyrls.Open(dir, envoyrls.LoadOptions{}, envoyrls.Options{})
	if err != nil {
		panic(err)
	}
	g := grpc.NewServer()
	svc.Register(g) // then g.Serve(listener): Envoy's rate_limit_service
	mux := http.NewServeMux()
	mux.Handle("/", svc.Handler(nil)) // /json, /healthcheck, /metrics
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Watch(ctx, 5*time.Second) // a bad file keeps the configuration in force

	for range 3 {
		resp, err := svc.ShouldRateLimit(ctx, request("remote_address", "10.0.0.1"))
		if err != nil {
			panic(err)
		}
		fmt.Println(resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	_, err = svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge"})
	fmt.Println(errors.Is(err, envoyrls.ErrBadRequest), status.Code(err))
	fmt.Println(src.Reload(), svc.Config().Domains())
	// Output:
	// OK 1
	// OK 0
	// OVER_LIMIT 0
	// true InvalidArgument
	// <nil> [edge]
}

// The service as cmd/throttled runs it: its "envoy" section, the
// listeners, reload and shutdown.
func ExampleStart() {
	dir := configDir(exampleYAML)
	defer os.RemoveAll(dir)
	c, err := envoyrls.DecodeServerConfig([]byte(`{"grpc": "127.0.0.1:0", "config": "` + filepath.ToSlash(dir) + `", "watch": "off"}`))
	if err == nil {
		err = c.Check()
	}
	if err != nil {
		panic(err)
	}
	srv, err := envoyrls.Start(c, nil, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(srv.Addrs()), srv.Reload(), srv.Service.Config().Rules())
	fmt.Println(srv.Shutdown(context.Background()))
	// Output:
	// 1 <nil> 1
	// <nil>
}

// A refused file names its line; the error wraps ErrInvalidConfig.
func ExampleLoad() {
	dir := configDir("domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	defer os.RemoveAll(dir)
	_, err := envoyrls.Load(dir, envoyrls.LoadOptions{MergeDomains: true})
	var ce *envoyrls.ConfigError
	fmt.Println(errors.Is(err, envoyrls.ErrInvalidConfig), errors.As(err, &ce) && ce.Line == 4)
	// Output: true true
}

// The counters in this process only, at most a million fixed-window
// keys.
func ExampleNewMemory() {
	mem := envoyrls.NewMemory(1_000_000)
	defer mem.Close()
	_ = envoyrls.Options{Backend: mem}
}

// The counters in a Redis shared by every instance, failing open when it
// is down; or on a go-redis client of the program's own (TLS, say).
func ExampleNewRedis() {
	r, err := envoyrls.NewRedis(envoyrls.RedisConfig{Addrs: []string{"redis:6379"}, Timeout: "50ms"})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	_ = envoyrls.Options{Backend: r, FailOpen: true}

	own := envoyrls.NewRedisClient(redis.NewClient(&redis.Options{Addr: "redis:6380"}), false, 50*time.Millisecond)
	defer own.Close()
}

// The limits shared by the instances of a fleet over their gossip nodes,
// each key decided by its owner.
func ExampleNewFleet() {
	var node *gossip.Node // the program's node: gossip.NewNode, then Start
	f := envoyrls.NewFleet(node, envoyrls.FleetOptions{Owner: true, Owned: gossip.OwnedConfig{Timeout: 50 * time.Millisecond}})
	defer f.Close()
	_ = envoyrls.Options{Backend: f}
}
