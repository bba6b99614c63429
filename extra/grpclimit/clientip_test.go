package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/grpclimit"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/throttletest"
)

// frozen is a clock standing still at a window's start, for the tests
// that count exact admissions in a fixed window: on the wall clock a
// window could end between two requests (a proxy test once admitted 10
// of 40 where the limit is 5 a minute).
func frozen() throttle.Option { return throttle.WithClock(throttletest.NewClock()) }

// call runs a unary call through the interceptor from peer addr with the
// incoming metadata md (name, value pairs), and returns its code.
func call(t *testing.T, in grpc.UnaryServerInterceptor, addr net.Addr, md ...string) codes.Code {
	t.Helper()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	if len(md) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
	}
	_, err := in(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/s/M"}, func(context.Context, any) (any, error) { return nil, nil })
	return status.Code(err)
}

// A client rotating addresses within its IPv6 /64 stays at its limit.
func TestPeerAddressIPv6By64(t *testing.T) {
	l, _ := fixedwindow.New(5, time.Minute, frozen())
	defer l.Close()
	in := grpclimit.UnaryServerInterceptor(l)
	admitted := 0
	for i := range 100 {
		ip := net.ParseIP(fmt.Sprintf("2001:db8:1:2::%x", i+1))
		if call(t, in, &net.TCPAddr{IP: ip, Port: 40000 + i}) == codes.OK {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("rotating within a /64: %d of 100 admitted, want 5", admitted)
	}
	if call(t, in, &net.TCPAddr{IP: net.ParseIP("2001:db8:1:3::1"), Port: 1}) != codes.OK {
		t.Fatal("another /64 limited")
	}
}

// Behind Envoy, which appends the peer it saw to x-forwarded-for: a client
// rotating the addresses it writes to the left stays at its limit, and
// naming another client costs that client nothing.
func TestClientIPBehindProxy(t *testing.T) {
	l, _ := fixedwindow.New(5, time.Minute, frozen())
	defer l.Close()
	in := grpclimit.UnaryServerInterceptor(l, grpclimit.WithKey(grpclimit.ClientIP(httplimit.TrustProxy("X-Forwarded-For", 1))))
	envoy := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}
	admitted := 0
	for i := range 40 {
		named := fmt.Sprintf("198.51.100.%d", i)
		if i%4 == 0 {
			named = "192.0.2.7" // the victim
		}
		if call(t, in, envoy, "x-forwarded-for", named+", 192.0.2.66") == codes.OK {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("rotating x-forwarded-for: %d of 40 admitted, want 5", admitted)
	}
	if code := call(t, in, envoy, "x-forwarded-for", "192.0.2.7"); code != codes.OK {
		t.Fatalf("victim: %v", code)
	}
	if code := call(t, in, envoy, "x-forwarded-for", "6.6.6.6, garbage"); code != codes.InvalidArgument {
		t.Fatalf("garbage from the proxy: %v", code)
	}
	// Over a Unix socket (a sidecar), the header is read too.
	if code := call(t, in, &net.UnixAddr{Name: "@envoy", Net: "unix"}, "x-forwarded-for", "192.0.2.8"); code != codes.OK {
		t.Fatalf("unix peer: %v", code)
	}
}
