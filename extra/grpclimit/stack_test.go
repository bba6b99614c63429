package grpclimit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/extra/grpclimit"
	"github.com/throttlekit/throttle/retry"
	"github.com/throttlekit/throttle/tokenbucket"
)

// chain composes unary client interceptors as grpc.WithChainUnaryInterceptor
// does (the first outermost) in front of invoker.
func chain(invoker grpc.UnaryInvoker, ics ...grpc.UnaryClientInterceptor) func(context.Context) error {
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], invoker
		invoker = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			return ic(ctx, method, req, reply, cc, next, opts...)
		}
	}
	return func(ctx context.Context) error { return invoker(ctx, checkMethod, nil, nil, nil) }
}

// TestDocumentedStackHealthyServer is TestDocumentedStackHealthyUpstream
// (package httplimit) for gRPC, with the interceptors in the guide's order:
// retries, the Throttler, then a fail-fast client limit of 2 calls a
// second, in front of a server that answers every call. The limiter's
// refusals never reach the server, so the Throttler never drops, the
// budget is not spent, and the server serves what the limiter allows.
// Before, the refusals counted as rejections: the Throttler dropped calls
// the limiter would have let through, and a lone client afterwards too.
func TestDocumentedStackHealthyServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := tokenbucket.New(throttle.PerSecond(2), 2)
		if err != nil {
			t.Fatal(err)
		}
		th, err := adaptive.NewThrottler(adaptive.ThrottlerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		budget, err := retry.NewBudget(10, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		var served, drops atomic.Int64
		call := chain(func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			served.Add(1)
			return nil
		},
			grpclimit.RetryUnaryClientInterceptor(&retry.Policy{Budget: budget}, nil),
			grpclimit.ThrottledUnaryClientInterceptor(th),
			grpclimit.UnaryClientInterceptor(lim, grpclimit.WithFailFast()))
		do := func() {
			err := call(context.Background())
			if _, ok := grpclimit.RetryDelay(err); status.Code(err) == codes.ResourceExhausted && !ok {
				drops.Add(1) // the Throttler's drop: no time stated
			} else if err != nil && status.Code(err) != codes.ResourceExhausted {
				t.Error(err)
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		// Each client starts 1 ms after the one before, so that no two
		// requests are in flight at one instant: 16 refused together can
		// raise the drop probability for the moment between the
		// Throttler's count and the withdrawal, and its own drops can then
		// keep it up (stated in the registry, edge-outbound).
		for i := range 16 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond)
				for range 40 {
					do()
					time.Sleep(time.Second)
				}
			})
		}
		wg.Wait()
		allows := 2 + int64(2*time.Since(start).Seconds())
		if n := served.Load(); n < allows-2 || n > allows || drops.Load() != 0 || budget.Tokens() < 10 {
			t.Errorf("served %d (the limiter allows %d), the Throttler dropped %d (drop probability %.2f), budget %.1f of 10",
				n, allows, drops.Load(), th.DropProbability(), budget.Tokens())
		}
		before := served.Load()
		for range 100 {
			do()
			time.Sleep(time.Second)
		}
		if n := served.Load() - before; n != 100 || drops.Load() != 0 {
			t.Errorf("one client alone: %d of 100 served, %d dropped by the Throttler", n, drops.Load())
		}
	})
}

// TestRetryClientPastDeadline: a RetryInfo delay longer than the call's
// remaining deadline is not waited for; the server's RESOURCE_EXHAUSTED is
// returned at once. Before, the interceptor slept into the deadline.
func TestRetryClientPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		call := chain(func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			calls++
			return grpclimit.Denied(throttle.Decision{RetryAfter: 5 * time.Second})
		}, grpclimit.RetryUnaryClientInterceptor(&retry.Policy{}, nil))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := call(ctx)
		if d, _ := grpclimit.RetryDelay(err); d != 5*time.Second || calls != 1 || time.Since(start) != 0 {
			t.Fatalf("got %v after %d calls and %v; want the server's refusal at once", err, calls, time.Since(start))
		}
	})
}
