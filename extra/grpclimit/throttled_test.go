package grpclimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/extra/grpclimit"
	"github.com/throttlekit/throttle/retry"
	"github.com/throttlekit/throttle/throttletest"
)

// TestThrottledClient: against a server refusing every call with
// RESOURCE_EXHAUSTED, the client drops calls locally, so the server sees
// fewer than were made; against a healthy one, it drops none.
func TestThrottledClient(t *testing.T) {
	for _, refuse := range []bool{true, false} {
		var seen atomic.Int64
		srv := grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			seen.Add(1)
			if refuse {
				return nil, grpclimit.Denied(throttle.Decision{})
			}
			return h(ctx, req)
		})
		th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{}, throttle.WithClock(throttletest.NewClock()))
		if err != nil {
			t.Fatal(err)
		}
		c := bufServe(t, []grpc.ServerOption{srv}, grpc.WithUnaryInterceptor(grpclimit.ThrottledUnaryClientInterceptor(th)))
		failed := 0
		for range 200 {
			_, err := c.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{})
			if status.Code(err) == codes.ResourceExhausted {
				failed++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if n := seen.Load(); refuse && (n >= 200 || failed != 200) || !refuse && (n != 200 || failed != 0) {
			t.Errorf("refusing %v: the server saw %d of 200 calls, %d failed", refuse, n, failed)
		}
	}
}

// A client that backs off locally when its backend answers
// RESOURCE_EXHAUSTED: one Throttler per backend.
func ExampleThrottledUnaryClientInterceptor() {
	th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{K: 2})
	if err != nil {
		panic(err)
	}
	_ = grpc.WithUnaryInterceptor(grpclimit.ThrottledUnaryClientInterceptor(th)) // pass to grpc.NewClient
}

// TestRetryClient: RESOURCE_EXHAUSTED is retried up to the cap;
// UNAVAILABLE only for a method said to be idempotent.
func TestRetryClient(t *testing.T) {
	for _, tc := range []struct {
		code       codes.Code
		idempotent func(string) bool
		want       int64
	}{
		{codes.ResourceExhausted, nil, 3},
		{codes.Unavailable, nil, 1},
		{codes.Unavailable, func(m string) bool { return m == checkMethod }, 3},
		{codes.Internal, func(string) bool { return true }, 1},
	} {
		var seen atomic.Int64
		srv := grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if seen.Add(1) < 3 {
				return nil, status.Error(tc.code, "busy")
			}
			return h(ctx, req)
		})
		p := &retry.Policy{MaxAttempts: 3, BaseDelay: time.Millisecond}
		c := bufServe(t, []grpc.ServerOption{srv}, grpc.WithUnaryInterceptor(grpclimit.RetryUnaryClientInterceptor(p, tc.idempotent)))
		_, err := c.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{})
		if n := seen.Load(); n != tc.want || (n == 3) != (err == nil) {
			t.Errorf("%v: the server saw %d calls, want %d; err %v", tc.code, n, tc.want, err)
		}
	}
}

// Retry calls refused for overload, and UNAVAILABLE calls of read-only
// methods, within a budget shared by the clients of one backend.
func ExampleRetryUnaryClientInterceptor() {
	budget, err := retry.NewBudget(10, 0.1)
	if err != nil {
		panic(err)
	}
	p := &retry.Policy{MaxAttempts: 3, Budget: budget}
	readOnly := func(m string) bool { return m == "/grpc.health.v1.Health/Check" }
	_ = grpc.WithUnaryInterceptor(grpclimit.RetryUnaryClientInterceptor(p, readOnly)) // pass to grpc.NewClient
}
