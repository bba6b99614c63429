package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

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

// newGRPCServer returns a grpc-go server of srv with the bounds of s; rd
// bounds the time a call has to receive its request.
func newGRPCServer(srv *capacity.Server, s *settings, met *metrics, rd *recvDeadline) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.InTapHandle(rd.tap),
		grpc.MaxRecvMsgSize(capacity.MaxRequestBytes),
		grpc.MaxHeaderListSize(uint32(s.http.maxHeaderBytes)),
		// The time a new connection has for its TLS handshake and
		// HTTP/2 preface.
		grpc.ConnectionTimeout(s.http.readHeader),
		// A connection lives at most idle_timeout (then is told to go
		// away), and its calls in flight read_timeout more; rd bounds
		// each call's time to receive its request by read_timeout.
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
		// GetCapacity's messages encoded without reflection.
		grpc.ForceServerCodecV2(grpcCodec{}),
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

// grpcMethods holds the full names of grpcDesc's methods.
var grpcMethods = func() map[string]bool {
	m := make(map[string]bool, len(grpcDesc.Methods))
	for _, d := range grpcDesc.Methods {
		m["/"+grpcDesc.ServiceName+"/"+d.MethodName] = true
	}
	return m
}()

// unary serves method with the wire service's method call.
func unary[Req, Resp any](method string, call func(capacityv1connect.CapacityServiceHandler, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: method, Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		// grpc-go has received the request before it calls the handler.
		requestReceived(ctx)
		g := srv.(*grpcAPI)
		t0 := time.Now()
		in := new(Req)
		err := dec(in)
		if err != nil {
			// A request that does not decode (malformed, nested too
			// deep) is the caller's fault, as on the listen port.
			err = connect.NewError(connect.CodeInvalidArgument, errors.New(status.Convert(err).Message()))
		}
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

// recvDeadline closes a connection of its listener when one of its calls
// has not received its whole request within read of the call's start,
// as the listen port's ReadTimeout does: grpc-go bounds no call's time to
// receive its request, so trickled requests could otherwise hold
// max_connections for idle_timeout. Its tap, the grpc-go server's
// InTapHandle, queues each call on its connection at its start; the call's
// handler takes it off with requestReceived. One timer per connection,
// armed while calls wait, fires at the oldest waiting call's deadline: no
// timer is made or stopped per call. It is safe for concurrent use; set
// its fields before Accept is first called.
type recvDeadline struct {
	net.Listener
	read time.Duration
	cut  func() // counts a connection closed
}

// deadlineConn is a connection of a recvDeadline listener. Its remote
// address, which grpc-go gives its calls as their peer's, leads back to it.
type deadlineConn struct {
	net.Conn
	addr connAddr
	l    *recvDeadline

	mu      sync.Mutex
	waiting []*waitingCall // oldest first, with received calls not yet dropped
	timer   *time.Timer    // nil until a call first waits
	armed   bool
}

// connAddr is the remote address of c.
type connAddr struct {
	net.Addr
	c *deadlineConn
}

// waitingCall is the context of a call, and its place in its connection's
// queue of calls waiting for their requests.
type waitingCall struct {
	context.Context
	c        *deadlineConn
	start    time.Time
	received bool // guarded by c.mu
}

type waitingKey struct{}

func (w *waitingCall) Value(key any) any {
	if key == (waitingKey{}) {
		return w
	}
	return w.Context.Value(key)
}

func (l *recvDeadline) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: c, l: l}
	dc.addr = connAddr{Addr: c.RemoteAddr(), c: dc}
	return dc, nil
}

func (c *deadlineConn) RemoteAddr() net.Addr { return &c.addr }

// tap queues a call of a method of grpcDesc at its start (grpc-go answers
// others at once, without reading their requests).
func (l *recvDeadline) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || !grpcMethods[info.FullMethodName] {
		return ctx, nil
	}
	a, ok := p.Addr.(*connAddr)
	if !ok {
		return ctx, nil
	}
	w := &waitingCall{Context: ctx, c: a.c, start: time.Now()}
	a.c.push(w)
	return w, nil
}

// requestReceived takes the call of ctx off its connection's queue: its
// request has arrived.
func requestReceived(ctx context.Context) {
	if w, ok := ctx.Value(waitingKey{}).(*waitingCall); ok {
		w.c.mu.Lock()
		w.received = true
		w.c.mu.Unlock()
	}
}

// push queues w, and arms the timer if it is not.
func (c *deadlineConn) push(w *waitingCall) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(false)
	c.waiting = append(c.waiting, w)
	switch {
	case c.armed:
	case c.timer == nil:
		c.timer = time.AfterFunc(c.l.read, c.expire)
	default:
		c.timer.Reset(c.l.read)
	}
	c.armed = true
}

// drop takes the calls received off the front of the queue, and with
// ended those that have ended (grpc-go cancels a call's context when it
// ends, also when it refused the request without calling the handler).
// c.mu is held.
func (c *deadlineConn) drop(ended bool) {
	n := 0
	for _, w := range c.waiting {
		if !w.received && (!ended || w.Err() == nil) {
			break
		}
		n++
	}
	c.waiting = slices.Delete(c.waiting, 0, n)
}

// expire runs when the timer fires. It closes the connection if the
// oldest call still waiting has waited read; otherwise it arms the timer
// for that call's deadline, or leaves it unarmed when none waits.
func (c *deadlineConn) expire() {
	c.mu.Lock()
	c.drop(true)
	if len(c.waiting) == 0 {
		c.armed = false
		c.mu.Unlock()
		return
	}
	if left := c.l.read - time.Since(c.waiting[0].start); left > 0 {
		c.timer.Reset(left)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.l.cut()
	c.Close()
}
