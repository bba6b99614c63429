package grpclimit

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	"github.com/throttlekit/throttle"
)

// UnaryClientInterceptor limits outgoing unary calls with l: by default a
// call waits its turn (throttle.Wait, or Hold for a throttle.Holder whose
// units are then held until the call returns) within the call's context;
// with WithFailFast it fails at once with codes.ResourceExhausted and a
// RetryInfo detail. The key defaults to the method (WithKey).
func UnaryClientInterceptor(l throttle.Limiter, opts ...Option) grpc.UnaryClientInterceptor {
	c := newConfig(l, Method(), opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		release, err := c.turn(ctx, l, method)
		if err != nil {
			return err
		}
		defer release()
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// StreamClientInterceptor limits the opening of outgoing streams with l,
// as UnaryClientInterceptor limits calls. A Holder's units are held until
// the stream is created, not for its whole life.
func StreamClientInterceptor(l throttle.Limiter, opts ...Option) grpc.StreamClientInterceptor {
	c := newConfig(l, Method(), opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		release, err := c.turn(ctx, l, method)
		if err != nil {
			return nil, err
		}
		defer release()
		return streamer(ctx, desc, cc, method, callOpts...)
	}
}

// turn waits for (or, failing fast, asks for) the call's units.
func (c *config) turn(ctx context.Context, l throttle.Limiter, method string) (func(), error) {
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
		err = throttle.Wait(ctx, l, key, n, c.waitOpts...)
	}
	switch {
	case err == nil:
		return release, nil
	case c.failOpen && errors.Is(err, throttle.ErrUnavailable):
		return func() {}, nil
	}
	return nil, statusOf(err)
}
