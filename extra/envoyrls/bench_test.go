package envoyrls

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/throttlekit/throttle/internal/redistest"
)

// BenchmarkDecide is one request of 1 or 4 descriptors decided in
// process, without gRPC: the service's own cost.
func BenchmarkDecide(b *testing.B) {
	cfg := mustParse(b, "f.yaml", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`)
	perDescriptors(b, cfg, func(b *testing.B, svc *Service, r *rlsv3.RateLimitRequest) {
		for b.Loop() {
			if _, err := svc.decide(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// perDescriptors runs f as sub-benchmarks "1" and "4", with a service of
// cfg on a Memory backend and a request of 1 or 4 descriptors in domain
// d, keys a, b, c and e, all of value x.
func perDescriptors(b *testing.B, cfg *Config, f func(b *testing.B, svc *Service, r *rlsv3.RateLimitRequest)) {
	for _, n := range []int{1, 4} {
		b.Run([]string{"", "1", "", "", "4"}[n], func(b *testing.B) {
			backend := NewMemory(0)
			defer backend.Close()
			r := req("d", desc("a", "x"), desc("b", "x"), desc("c", "x"), desc("e", "x"))
			r.Descriptors = r.Descriptors[:n]
			b.ReportAllocs()
			f(b, newService(cfg, Options{Backend: backend}), r)
		})
	}
}

// BenchmarkRedisCharge is one request of 1 or 4 fixed-window descriptors
// charged on one Redis server (one script) or on a 3-master Cluster (one
// script per key, pipelined, one round trip per master the keys hash to,
// in parallel), alone or from 16 goroutines at once (batched).
func BenchmarkRedisCharge(b *testing.B) {
	single := redistest.Start(b)
	cluster := redistest.StartCluster(b, 3)
	backends := map[string]*Redis{}
	for name, c := range map[string]RedisConfig{"single": {Addrs: []string{single.Addr}}, "cluster": {Addrs: cluster.Addrs, Cluster: true}} {
		r, err := NewRedis(RedisConfig{Addrs: c.Addrs, Cluster: c.Cluster, Timeout: "1s"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		backends[name] = r
	}
	limit := &limitRule{rlUnit: rlUnit(rlsv3.RateLimitResponse_RateLimit_DAY), RequestsPerUnit: 1 << 30}
	for _, name := range []string{"single", "cluster"} {
		for _, n := range []int{1, 4} {
			for _, par := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/descriptors=%d/goroutines=%d", name, n, par), func(b *testing.B) {
					b.SetParallelism(par)
					b.RunParallel(func(pb *testing.PB) {
						hits, out := make([]hit, n), make([]outcome, n)
						for i := range hits {
							hits[i] = hit{Key: fmt.Sprintf("bench_d%d_", i), Limit: limit, N: 1}
						}
						for pb.Next() {
							if err := backends[name].charge(context.Background(), time.Now(), hits, out); err != nil {
								b.Fatal(err)
							}
						}
					})
				})
			}
		}
	}
}

// BenchmarkServe is the server's work for one gRPC request of 1 or 4
// descriptors apart from the transport: the request decoded, decided in
// process, the response encoded (the server's codec).
func BenchmarkServe(b *testing.B) {
	cfg := mustParse(b, "f.yaml", `
domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: b, rate_limit: {unit: minute, requests_per_unit: 1000000000}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 1000000000}}
  - {key: e, rate_limit: {unit: day, requests_per_unit: 1000000000}}
`)
	perDescriptors(b, cfg, func(b *testing.B, svc *Service, r *rlsv3.RateLimitRequest) {
		wire, err := proto.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			in := new(rlsv3.RateLimitRequest)
			if err := serverCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, in); err != nil {
				b.Fatal(err)
			}
			resp, err := svc.ShouldRateLimit(context.Background(), in)
			if err != nil {
				b.Fatal(err)
			}
			out, err := serverCodec.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
	})
}
