package capacity

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/throttlekit/throttle/throttletest"
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

// bigServer returns a server past learning whose resource "big" has n
// clients wanting 10 each of capacity, with an hour of lease left; and
// its clock.
func bigServer(b *testing.B, n int, capacity float64) (*Server, *throttletest.Clock) {
	b.Helper()
	clk := throttletest.NewClock()
	cfg := Config{Resources: []Template{
		{ID: "big", Capacity: capacity, LeaseLength: 2 * time.Hour, RefreshInterval: time.Minute},
		{ID: "*", Capacity: 100, LeaseLength: 2 * time.Hour, RefreshInterval: time.Minute},
	}}
	s, err := NewServer(cfg, WithServerClock(clk), withSeed(1), WithMaxClients(n), WithMaxLeases(2*n+100, 10))
	if err != nil {
		b.Fatal(err)
	}
	// Fill while learning, which divides nothing; refresh halfway so
	// that the leases outlive learning.
	for range 2 {
		for i := range n {
			if _, err := s.GetCapacity(context.Background(), &Request{Client: fmt.Sprintf("c%06d", i), Resources: []ResourceRequest{{Resource: "big", Wants: 10}}}); err != nil {
				b.Fatal(err)
			}
		}
		clk.Advance(time.Hour)
	}
	clk.Advance(time.Second) // learning is over
	// The first division, of everyone's demand at once.
	if _, err := s.GetCapacity(context.Background(), &Request{Client: "c000000", Resources: []ResourceRequest{{Resource: "big", Wants: 10}}}); err != nil {
		b.Fatal(err)
	}
	return s, clk
}

// BenchmarkServerDemandChange measures a request that changes its
// client's demand on a resource of 100,000 clients, which makes the
// server divide the resource anew: uncontended (everyone gets what it
// wants) and contended (FairShare cuts everyone to half).
func BenchmarkServerDemandChange(b *testing.B) {
	const n = 100_000
	for _, tc := range []struct {
		name     string
		capacity float64
	}{{"uncontended", 1e9}, {"contended", 5 * n}} {
		b.Run(tc.name, func(b *testing.B) {
			s, _ := bigServer(b, n, tc.capacity)
			reqs := make([]*Request, 64)
			for i := range reqs {
				reqs[i] = &Request{Client: fmt.Sprintf("c%06d", i*(n/len(reqs))), Resources: []ResourceRequest{{Resource: "big"}}}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				req := reqs[i%len(reqs)]
				req.Resources[0].Wants = float64(11 + i/len(reqs)%2) // 11 or 12: always a change
				if _, err := s.GetCapacity(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkServerBesideRecompute measures GetCapacity on a small resource
// while another goroutine changes a demand on a contended resource of
// 100,000 clients every 2 ms, across the client's share (each change
// divides it anew, which takes about as long): with one lock for the whole
// server the small resource's requests wait for those divisions.
// ns/refresh is the time of a small resource's request (ns/op includes the
// pauses between them).
func BenchmarkServerBesideRecompute(b *testing.B) {
	const n = 100_000
	s, _ := bigServer(b, n, 5*n)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := &Request{Client: "c000000", Resources: []ResourceRequest{{Resource: "big"}}}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			req.Resources[0].Wants = float64(3 + 9*(i%2)) // across its share of 5: a division
			if _, err := s.GetCapacity(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	req := &Request{Client: "small", Resources: []ResourceRequest{{Resource: "small", Wants: 1}}}
	b.ReportAllocs()
	b.ResetTimer()
	// Requests spread over time, 200 µs apart, so that they fall both
	// during and between divisions; only their own time is counted.
	var took time.Duration
	for range b.N {
		time.Sleep(200 * time.Microsecond)
		t0 := time.Now()
		if _, err := s.GetCapacity(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		took += time.Since(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "ns/refresh")
	close(stop)
	<-done
}

// BenchmarkResourceAllow is a decision on a leased resource: a rate
// resource's bucket and a gauge resource's semaphore.
func BenchmarkResourceAllow(b *testing.B) {
	n := new(memNetwork)
	n.Attach("s1", laterServer(b, testConfig(1e9)))
	c, err := NewClient(n, []string{"s1"}, WithClientID("a"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rate, err := c.Rate("r", 1e9) // capacity 1e9/s
	if err != nil {
		b.Fatal(err)
	}
	gauge, err := c.Gauge("g", 5) // capacity 10
	if err != nil {
		b.Fatal(err)
	}
	for rate.Capacity() == 0 || gauge.Capacity() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx := context.Background()
	b.Run("rate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := rate.Allow(ctx, "", 1); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
	b.Run("gauge", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := gauge.Allow(ctx, "", 1); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			gauge.Release(1)
		}
	})
}
