package main

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle/distributed/capacity"
	"github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1/capacityv1connect"
)

// The grpc_listen port serves the wire API over gRPC only, with grpc-go's
// own HTTP/2 transport: about a third of the CPU per call of the listen port's
// handler (which serves gRPC, gRPC-Web and Connect through net/http).
// Requests, answers, authentication, bounds and metrics are the listen
// port's.

// grpcAPI is the service grpc-go calls.
type grpcAPI struct {
	svc  capacityv1connect.CapacityServiceHandler
	auth capacity.Authenticator // nil: no authentication
	met  *metrics
}

// newGRPCServer returns a grpc-go server of srv with the bounds of s.
func newGRPCServer(srv *capacity.Server, s *settings, met *metrics) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(capacity.MaxRequestBytes),
		grpc.MaxHeaderListSize(uint32(s.http.maxHeaderBytes)),
		// The time a new connection has for its TLS handshake and
		// HTTP/2 preface.
		grpc.ConnectionTimeout(s.http.readHeader),
		// grpc-go bounds no call's time to send its request: a
		// connection lives at most idle_timeout (then is told to go
		// away), and its calls in flight read_timeout more.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.http.idle,
			MaxConnectionAge: s.http.idle, MaxConnectionAgeGrace: s.http.read}),
		grpc.MaxConcurrentStreams(maxGRPCStreams),
		// Fixed flow-control windows turn off grpc-go's bandwidth
		// probing, a ping per burst of data: the messages are small.
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(1 << 20),
		// Calls run on a pool of goroutines instead of one new
		// goroutine (and stack) each.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	if s.auth.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.auth.tls)))
	}
	g := grpc.NewServer(opts...)
	g.RegisterService(&grpcDesc, &grpcAPI{svc: capacity.WireService(srv), auth: s.auth.auth, met: met})
	return g
}

// maxGRPCStreams bounds the calls one connection has in flight: a client
// refreshes its leases with one call at a time.
const maxGRPCStreams = 64

var grpcDesc = grpc.ServiceDesc{
	ServiceName: capacityv1connect.CapacityServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("GetCapacity", capacityv1connect.CapacityServiceHandler.GetCapacity),
		unary("ReleaseCapacity", capacityv1connect.CapacityServiceHandler.ReleaseCapacity),
		unary("GetStatus", capacityv1connect.CapacityServiceHandler.GetStatus),
	},
	Metadata: "throttle/capacity/v1/capacity.proto",
}

// unary serves method with the wire service's method call.
func unary[Req, Resp any](method string, call func(capacityv1connect.CapacityServiceHandler, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: method, Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		g := srv.(*grpcAPI)
		t0 := time.Now()
		in := new(Req)
		err := dec(in)
		var out *connect.Response[Resp]
		if err == nil {
			if ctx, err = g.authenticate(ctx); err == nil {
				out, err = call(g.svc, ctx, connect.NewRequest(in))
			}
		}
		if err != nil {
			g.met.observe(method, t0, nil, err)
			return nil, grpcError(err)
		}
		g.met.observe(method, t0, out.Msg, nil)
		return out.Msg, nil
	}}
}

// authenticate returns ctx with the caller's identity, when the API is
// authenticated: the Authenticator sees the caller's verified TLS state
// and its authorization metadata as an HTTP request's.
func (g *grpcAPI) authenticate(ctx context.Context) (context.Context, error) {
	if g.auth == nil {
		return ctx, nil
	}
	r := &http.Request{Header: http.Header{}}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get("authorization") {
			r.Header.Add("Authorization", v)
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			st := ti.State
			r.TLS = &st
		}
	}
	id, err := g.auth(r)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return capacity.WithIdentity(ctx, id), nil
}

// grpcError turns a wire error into a gRPC status of the same code.
func grpcError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err // grpc-go's own: the request did not decode
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return status.Error(codes.Code(ce.Code()), ce.Message())
	}
	return status.Error(codes.Internal, err.Error())
}

// stopGRPC stops g, waiting for the calls in flight until ctx is done.
func stopGRPC(ctx context.Context, g *grpc.Server) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		g.Stop()
		<-done
	}
}
