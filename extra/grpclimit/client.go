package grpclimit

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/unsent"
)

// UnaryClientInterceptor limits outgoing unary calls with l: by default a
// call waits its turn (throttle.Wait, or Hold for a throttle.Holder whose
// units are then held until the call returns) within the call's context;
// with WithFailFast it fails at once with codes.ResourceExhausted and a
// RetryInfo detail. The key defaults to the method (WithKey).
func UnaryClientInterceptor(l throttle.Limiter, opts ...Option) grpc.UnaryClientInterceptor {
	c := newConfig(l, Method(), opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		ctx, hold := unsent.Begin(ctx, l)
		release, err := c.turn(ctx, l, method)
		if err != nil {
			hold.End(func() {}, err)
			return err
		}
		err = invoker(ctx, method, req, reply, cc, callOpts...)
		hold.End(release, err)
		return err
	}
}

// StreamClientInterceptor limits the opening of outgoing streams with l,
// as UnaryClientInterceptor limits calls. A Holder's units are held until
// the stream is created, not for its whole life.
func StreamClientInterceptor(l throttle.Limiter, opts ...Option) grpc.StreamClientInterceptor {
	c := newConfig(l, Method(), opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		hctx, hold := unsent.Begin(ctx, l)
		release, err := c.turn(hctx, l, method)
		if err != nil {
			hold.End(func() {}, err)
			return nil, err
		}
		s, err := streamer(ctx, desc, cc, method, callOpts...)
		hold.End(release, err)
		return s, err
	}
}

// turn waits for (or, failing fast, asks for) the call's units. Its
// errors are marked as not sent (adaptive.NotSent), so the throttling and
// retry interceptors in front of this one do not count them as the
// server's.
func (c *config) turn(ctx context.Context, l throttle.Limiter, method string) (func(), error) {
	release, err := c.turn1(ctx, l, method)
	if err != nil {
		return nil, localStatus(err)
	}
	return release, nil
}

func (c *config) turn1(ctx context.Context, l throttle.Limiter, method string) (func(), error) {
	if c.skip != nil && c.skip(method) {
		return func() {}, nil
	}
	if c.failFast {
		release, _, err := c.acquire(ctx, l, method)
		if err != nil {
			release()
			return nil, err
		}
		return release, nil
	}
	key, err := c.keyOf(ctx, method)
	if err != nil {
		return nil, err
	}
	n := c.cost(ctx, method)
	release := func() {}
	if h, ok := l.(throttle.Holder); ok {
		release, err = h.Hold(ctx, key, n)
	} else {
		err = throttle.Wait(ctx, l, key, n)
	}
	switch {
	case err == nil:
		return release, nil
	case c.failOpen && errors.Is(err, throttle.ErrUnavailable):
		return func() {}, nil
	}
	return nil, statusOf(err)
}

// notSent is the status error of a call a client interceptor refused
// before it left the client: its status is the refusal's, and it wraps
// adaptive.ErrNotSent.
type notSent struct{ err error }

func (e notSent) Error() string              { return e.err.Error() }
func (e notSent) Unwrap() []error            { return []error{e.err, unsent.Err} }
func (e notSent) GRPCStatus() *status.Status { return status.Convert(e.err) }

// localStatus marks a client interceptor's refusal as not sent.
func localStatus(err error) error {
	if err == nil || unsent.Is(err) {
		return err
	}
	return notSent{err}
}
