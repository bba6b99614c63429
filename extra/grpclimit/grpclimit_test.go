package grpclimit_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/extra/grpclimit"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// serve runs a health server with the given options on lis and returns a
// client of it.
func serve(t *testing.T, lis net.Listener, dial func(context.Context, string) (net.Conn, error), srvOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	srv := grpc.NewServer(srvOpts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	target := lis.Addr().String()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dial != nil {
		target = "passthrough:///bufnet"
		opts = append(opts, grpc.WithContextDialer(dial))
	}
	conn, err := grpc.NewClient(target, append(opts, dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return healthpb.NewHealthClient(conn)
}

func bufServe(t *testing.T, srvOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) healthpb.HealthClient {
	lis := bufconn.Listen(1 << 20)
	return serve(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }, srvOpts, dialOpts...)
}

// withKey is a bounded context carrying the API key.
func withKey(t *testing.T, key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
}

func TestUnaryDenied(t *testing.T) {
	tb, _ := tokenbucket.New(throttle.PerSecond(1), 2, throttle.WithClock(throttletest.NewClock()))
	c := bufServe(t, []grpc.ServerOption{grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(tb,
		grpclimit.WithKey(grpclimit.Metadata("x-api-key"))))})
	for i := 0; i < 2; i++ {
		var hdr metadata.MD
		if _, err := c.Check(withKey(t, "alice"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		want := []string{`"default";r=1;t=1`, `"default";r=0;t=1`}[i] // t: until the next token, not until full
		if got := hdr.Get("ratelimit"); len(got) != 1 || got[0] != want {
			t.Fatalf("call %d: ratelimit %v, want %s", i, hdr, want)
		}
		if got := hdr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"default";q=2;w=2` {
			t.Fatalf("call %d: ratelimit-policy %v", i, hdr)
		}
		if len(hdr.Get("x-ratelimit-remaining")) != 0 {
			t.Fatalf("call %d: legacy metadata without WithLegacyHeaders: %v", i, hdr)
		}
	}
	var trl metadata.MD
	_, err := c.Check(withKey(t, "alice"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trl))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call: %v", err)
	}
	if d, ok := grpclimit.RetryDelay(err); !ok || d != time.Second {
		t.Fatalf("retry delay %v %v", d, ok)
	}
	if got := trl.Get("retry-after"); len(got) != 1 || got[0] != "1" {
		t.Fatalf("trailer %v", trl)
	}
	if _, err := c.Check(withKey(t, "bob"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("another key: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no key: %v", err)
	}
}

// A concurrency limit holds its unit for the life of a stream.
func TestStreamHolds(t *testing.T) {
	sem, _ := counting.New(1)
	c := bufServe(t, []grpc.ServerOption{grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(sem,
		grpclimit.WithKey(grpclimit.Method())))})
	ctx1, cancel1 := context.WithCancel(context.Background())
	s1, err := c.Watch(ctx1, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	s2, err := c.Watch(ctx2, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s2.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v", err)
	}
	// A full concurrency limit knows no time (waiting frees nothing): no
	// RetryInfo, no retry-after, and ratelimit r=0 without t. Before: a
	// delay of 1 s beside t=0.
	trl := s2.Trailer()
	if d, ok := grpclimit.RetryDelay(err); ok || len(trl.Get("retry-after")) != 0 {
		t.Fatalf("second stream: retry delay %v, retry-after %v; want none", d, trl.Get("retry-after"))
	}
	if got := trl.Get("ratelimit"); len(got) != 1 || got[0] != `"default";r=0` {
		t.Fatalf("second stream: ratelimit %v, want \"default\";r=0", got)
	}
	cancel1()
	// The first stream's handler returns and releases; a new one fits.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s3, err := c.Watch(ctx2, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = s3.Recv()
		}
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("after release: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// A panicking handler still releases what it held.
func TestPanicReleases(t *testing.T) {
	sem, _ := counting.New(1)
	in := grpclimit.UnaryServerInterceptor(sem, grpclimit.WithKey(grpclimit.Method()))
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		in(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, func(context.Context, any) (any, error) {
			panic("boom")
		})
	}()
	d, release, err := sem.TryHold(context.Background(), checkMethod, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("unit not released: %+v %v", d, err)
	}
	release()
}

func TestUnavailable(t *testing.T) {
	down := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, throttle.ErrUnavailable
	})
	run := func(opts ...grpclimit.Option) error {
		in := grpclimit.UnaryServerInterceptor(down, append([]grpclimit.Option{grpclimit.WithKey(grpclimit.Method())}, opts...)...)
		_, err := in(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, func(context.Context, any) (any, error) {
			return "ok", nil
		})
		return err
	}
	if err := run(); status.Code(err) != codes.Unavailable {
		t.Fatalf("default: %v", err)
	}
	if err := run(grpclimit.WithFailOpen()); err != nil {
		t.Fatalf("fail open: %v", err)
	}
	if err := run(grpclimit.WithSkip(func(m string) bool { return m == checkMethod })); err != nil {
		t.Fatalf("skipped: %v", err)
	}
	denied := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, throttle.ErrDenied
	})
	in := grpclimit.UnaryServerInterceptor(denied, grpclimit.WithKey(grpclimit.Method()))
	if _, err := in(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, nil); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("deny list: %v", err)
	}
}

// The waiting client interceptor retries after RetryAfter until admitted;
// failing fast it returns the server's status at once.
func TestClient(t *testing.T) {
	var asked atomic.Int32
	flaky := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		if asked.Add(1) < 3 {
			return throttle.Decision{Limit: 1, RetryAfter: time.Millisecond}, nil
		}
		return throttle.Decision{Allowed: true, Limit: 1}, nil
	})
	c := bufServe(t, nil, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(flaky)))
	if _, err := c.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if asked.Load() != 3 {
		t.Fatalf("asked %d times, want 3", asked.Load())
	}

	tb, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1, throttle.WithClock(throttletest.NewClock()))
	fast := bufServe(t, nil, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(tb, grpclimit.WithFailFast())))
	if _, err := fast.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := fast.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{})
	if d, ok := grpclimit.RetryDelay(err); status.Code(err) != codes.ResourceExhausted || !ok || d != time.Hour {
		t.Fatalf("fail fast: %v (%v)", err, d)
	}
	// Waiting, with a deadline nearer than the next slot: DeadlineExceeded.
	wait := bufServe(t, nil, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(tb)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := wait.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("wait past deadline: %v", err)
	}
}

// TestStreamClient: a stream opens once its units are granted; failing
// fast, one over the limit does not open and gets ResourceExhausted.
func TestStreamClient(t *testing.T) {
	tb, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1, throttle.WithClock(throttletest.NewClock()))
	defer tb.Close()
	opened := 0
	streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		opened++
		return nil, nil
	}
	in := grpclimit.StreamClientInterceptor(tb, grpclimit.WithFailFast())
	if _, err := in(context.Background(), &grpc.StreamDesc{}, nil, "/s/Watch", streamer); err != nil || opened != 1 {
		t.Fatalf("first stream: %v, %d opened", err, opened)
	}
	_, err := in(context.Background(), &grpc.StreamDesc{}, nil, "/s/Watch", streamer)
	if d, ok := grpclimit.RetryDelay(err); status.Code(err) != codes.ResourceExhausted || !ok || d != time.Hour || opened != 1 {
		t.Fatalf("second stream: %v (%v), %d opened", err, d, opened)
	}
}

// Over real TCP on loopback, keyed by the peer's address.
func TestLoopback(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	tb, _ := tokenbucket.New(throttle.NewRate(1, time.Hour), 1, throttle.WithClock(throttletest.NewClock()))
	spy := throttle.LimiterFunc(func(ctx context.Context, key string, n int) (throttle.Decision, error) {
		keys = append(keys, key)
		return tb.Allow(ctx, key, n)
	})
	c := serve(t, lis, nil, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(spy)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(spy)),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call: %v", err)
	}
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream: %v", err)
	}
	if len(keys) != 3 || keys[0] != "127.0.0.1" {
		t.Fatalf("keys %q", keys)
	}
}
