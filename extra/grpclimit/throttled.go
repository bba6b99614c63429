package grpclimit

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/retry"
)

// ThrottledUnaryClientInterceptor adds client-side adaptive throttling
// (see adaptive.Throttler) to outgoing unary calls: a call t drops fails
// at once with codes.ResourceExhausted and a RetryInfo detail, without
// reaching the server (its error also wraps adaptive.ErrNotSent). A call
// counts as accepted unless it fails with ResourceExhausted, Unavailable
// or DeadlineExceeded; a call a client interceptor after this one refused
// locally (adaptive.NotSent) is withdrawn: it counts neither as a request
// nor as a rejection. Share one Throttler among the clients of one
// backend.
func ThrottledUnaryClientInterceptor(t *adaptive.Throttler) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := throttled(ctx, t, method); err != nil {
			return err
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		count(t, err)
		return err
	}
}

// ThrottledStreamClientInterceptor throttles the opening of streams as
// ThrottledUnaryClientInterceptor throttles calls; a stream counts as
// accepted when it opens.
func ThrottledStreamClientInterceptor(t *adaptive.Throttler) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := throttled(ctx, t, method); err != nil {
			return nil, err
		}
		s, err := streamer(ctx, desc, cc, method, opts...)
		count(t, err)
		return s, err
	}
}

// throttled asks t about a call and returns the error of a dropped one,
// marked as not sent.
func throttled(ctx context.Context, t *adaptive.Throttler, method string) error {
	d, err := t.Allow(ctx, method, 1)
	switch {
	case err != nil:
		return localStatus(statusOf(err))
	case !d.Allowed:
		return localStatus(Denied(d))
	}
	return nil
}

// count tells t how a call it let through ended: withdrawn when a local
// limiter behind t refused it (adaptive.NotSent), accepted unless the
// server refused it for overload or it timed out.
func count(t *adaptive.Throttler, err error) {
	switch {
	case adaptive.NotSent(err):
		t.Withdraw(1)
	case acceptedCode(status.Code(err)):
		t.Accept(1)
	}
}

func acceptedCode(c codes.Code) bool {
	return c != codes.ResourceExhausted && c != codes.Unavailable && c != codes.DeadlineExceeded
}

// RetryUnaryClientInterceptor retries outgoing unary calls under p: a
// call refused with RESOURCE_EXHAUSTED (which a server limiter answers
// before running it) is retried after the policy's back-off or the
// RetryInfo delay (spread by up to a fifth more), whichever is longer; a
// call failing with UNAVAILABLE is retried only when idempotent(method)
// says the method is safe to repeat (nil: no method is). A wait that
// would end past the call's deadline is not started (the last error is
// returned), and a call refused by a client interceptor after this one
// (adaptive.NotSent) is not charged to p's Budget (retry.Policy.NextCall).
// Share p, and its Budget, per backend.
func RetryUnaryClientInterceptor(p *retry.Policy, idempotent func(fullMethod string) bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			code := status.Code(err)
			switch {
			case err == nil:
				p.Succeeded()
				return nil
			case ctx.Err() != nil,
				code != codes.ResourceExhausted && (code != codes.Unavailable || idempotent == nil || !idempotent(method)):
				return err
			}
			hint, _ := RetryDelay(err)
			delay, ok := p.NextCall(ctx, attempt, hint, err)
			if !ok || retry.Sleep(ctx, delay) != nil {
				return err
			}
		}
	}
}
