package capacity

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// BenchmarkWireGetCapacity measures GetCapacity calls per second over
// loopback from 100 clients, each refreshing one resource.
func BenchmarkWireGetCapacity(b *testing.B) {
	_, addr := warmWireServer(b, 1000)
	for _, tc := range []struct {
		name string
		tr   *HTTPTransport
	}{
		{"json", NewHTTPTransport(&http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}, Timeout: 10 * time.Second}, connect.WithProtoJSON())},
		{"grpc", NewHTTPTransport(h2cClient(), connect.WithGRPC())},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(50) // 100 goroutines on 2 CPUs
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				id := fmt.Sprintf("client-%03d", next.Add(1)%100)
				req := &Request{Client: id, Resources: []ResourceRequest{{Resource: "r", Wants: 15}}}
				for pb.Next() {
					if _, err := tc.tr.GetCapacity(context.Background(), addr, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
		})
	}
}

// BenchmarkServerGetCapacity measures the server alone, in process.
func BenchmarkServerGetCapacity(b *testing.B) {
	s := laterServer(b, testConfig(1000))
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		id := fmt.Sprintf("client-%03d", next.Add(1)%100)
		req := &Request{Client: id, Resources: []ResourceRequest{{Resource: "r", Wants: 15}}}
		for pb.Next() {
			if _, err := s.GetCapacity(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
