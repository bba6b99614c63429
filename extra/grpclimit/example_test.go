package grpclimit_test

import (
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/grpclimit"
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
