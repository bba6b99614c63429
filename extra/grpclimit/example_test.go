package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/grpclimit"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A server limiting each API key to 100 calls per second with bursts of
// 20, unary and streaming, health checks exempt.
func Example() {
	l, err := tokenbucket.New(throttle.PerSecond(100), 20)
	if err != nil {
		panic(err)
	}
	opts := []grpclimit.Option{
		grpclimit.WithKey(grpclimit.Metadata("x-api-key")),
		grpclimit.WithSkip(func(method string) bool { return method == "/grpc.health.v1.Health/Check" }),
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(l, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(l, opts...)),
	)
	defer srv.Stop()
	err = grpclimit.Denied(throttle.Decision{RetryAfter: 1500 * time.Millisecond})
	d, _ := grpclimit.RetryDelay(err)
	fmt.Println(err, "|", d)
	// Output: rpc error: code = ResourceExhausted desc = rate limited, retry after 1.5s | 1.5s
}

// Behind one Envoy that appends the peer it saw to x-forwarded-for, each
// client is keyed by that address (IPv6 by its /64); what a client wrote
// to the left of it is never read.
func ExampleClientIP() {
	l, err := tokenbucket.New(throttle.PerSecond(10), 20)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	key := grpclimit.ClientIP(httplimit.TrustProxy("x-forwarded-for", 1))
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(l, grpclimit.WithKey(key))))
	defer srv.Stop()

	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 443}})
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", "192.0.2.66, 2001:db8:1:2::7"))
	fmt.Println(key(ctx, "/pkg.Service/Method"))
	// Output: 2001:db8:1:2::/64 <nil>
}
