package grpclimit

import (
	"context"

	"google.golang.org/grpc"

	"github.com/throttlekit/throttle"
)

// UnaryServerInterceptor limits unary calls with l; see the package
// documentation. The interceptor is safe for concurrent use if l is.
func UnaryServerInterceptor(l throttle.Limiter, opts ...Option) grpc.UnaryServerInterceptor {
	c := newConfig(l, ClientIP(), opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c.skip != nil && c.skip(info.FullMethod) {
			return handler(ctx, req)
		}
		release, md, err := c.acquire(ctx, l, info.FullMethod)
		defer release()
		if err != nil {
			if md != nil {
				_ = grpc.SetTrailer(ctx, md)
			}
			return nil, err
		}
		if md != nil {
			_ = grpc.SetHeader(ctx, md)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor limits the opening of streams with l; a Holder's
// units are held until the stream's handler returns. See the package
// documentation.
func StreamServerInterceptor(l throttle.Limiter, opts ...Option) grpc.StreamServerInterceptor {
	c := newConfig(l, ClientIP(), opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if c.skip != nil && c.skip(info.FullMethod) {
			return handler(srv, ss)
		}
		release, md, err := c.acquire(ss.Context(), l, info.FullMethod)
		defer release()
		if err != nil {
			if md != nil {
				ss.SetTrailer(md)
			}
			return err
		}
		if md != nil {
			_ = ss.SetHeader(md)
		}
		return handler(srv, ss)
	}
}
