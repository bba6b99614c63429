// Package grpclimit rate-limits gRPC calls with any throttle.Limiter:
// server interceptors that refuse calls over the limit, and client
// interceptors that wait for their turn or fail fast.
//
//	l, _ := tokenbucket.New(throttle.PerSecond(100), 20)
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(l, grpclimit.WithKey(grpclimit.Metadata("x-api-key")))),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(l)),
//	)
//
// A refused call ends with codes.ResourceExhausted, a google.rpc.RetryInfo
// detail whose retry_delay is the limiter's RetryAfter (none when it
// states no time, as a full concurrency limit), and in its
// trailer the metadata of the IETF RateLimit header fields
// (draft-ietf-httpapi-ratelimit-headers, as httplimit sends them):
// ratelimit-policy ("name";q=limit;w=window seconds, from the limiter's
// throttle.Quota when it states one) and ratelimit ("name";r=remaining;
// t=seconds), plus retry-after (whole seconds, rounded up); an admitted
// call gets the two fields in its header. WithLegacyHeaders adds the
// x-ratelimit-limit, x-ratelimit-remaining and x-ratelimit-reset trio. When the limiter is a throttle.Holder (a concurrency limit),
// the units are held while the handler runs (the whole stream for a
// streaming call) and released when it returns or panics.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/internal/clientip"
	"github.com/throttlekit/throttle/internal/ratefields"
)

// KeyFunc returns the key a call is limited under. fullMethod is the
// call's method, "/package.Service/Method". An error refuses the call:
// with its own status if it has one, else codes.InvalidArgument.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// ClientIP keys calls by client IP address, as httplimit.ClientIP keys
// requests, with its options: by default the peer's address, IPv6
// grouped by /64 (httplimit.IPv6Prefix); behind proxies, the address
// httplimit.TrustProxy says they write into the incoming metadata (name
// in lower case), such as Envoy's x-forwarded-for:
//
//	grpclimit.ClientIP(httplimit.TrustProxy("x-forwarded-for", 1))
//
// A peer on a non-IP transport (a Unix socket) is keyed by its address
// when no header is read from it. A call whose address cannot be read is
// refused with codes.InvalidArgument. ClientIP panics on an invalid
// option, as httplimit.ClientIP does.
func ClientIP(opts ...httplimit.IPOption) KeyFunc {
	c, err := clientip.New(opts...)
	if err != nil {
		panic("grpclimit: ClientIP: " + err.Error())
	}
	name := strings.ToLower(c.Header())
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", status.Error(codes.InvalidArgument, "grpclimit: no peer address")
		}
		var values []string
		if name != "" {
			md, _ := metadata.FromIncomingContext(ctx)
			values = md[name]
		}
		var a netip.Addr
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			a = tcp.AddrPort().Addr()
		} else if a, err = clientip.ParseHost(p.Addr.String()); err != nil {
			// Not an IP transport: the header, unless limited to IP proxies.
			if !c.Proxied() {
				if key, ok, err := c.FromHeader(values); ok || err != nil {
					return key, keyErr(err)
				}
			}
			return p.Addr.String(), nil
		}
		key, err := c.KeyAddr(a, values)
		return key, keyErr(err)
	}
}

func keyErr(err error) error {
	if err != nil {
		return status.Error(codes.InvalidArgument, "grpclimit: "+err.Error())
	}
	return nil
}

// Metadata keys calls by the first value of the incoming metadata name
// (an API key, a tenant). A call without it is refused with
// codes.InvalidArgument (codes.Unauthenticated is for the auth layer to
// say, before this one).
func Metadata(name string) KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", status.Errorf(codes.InvalidArgument, "grpclimit: metadata %q is missing", name)
	}
}

// Method keys calls by their full method name: one limit per method.
func Method() KeyFunc {
	return func(_ context.Context, fullMethod string) (string, error) { return fullMethod, nil }
}

// Option configures the interceptors.
type Option func(*config)

type config struct {
	key      KeyFunc
	cost     func(ctx context.Context, fullMethod string) int
	failOpen bool
	failFast bool
	skip     func(fullMethod string) bool
	legacy   bool
	name     string
	rep      ratefields.Reporter
}

func newConfig(l throttle.Limiter, defaultKey KeyFunc, opts []Option) config {
	c := config{key: defaultKey, cost: func(context.Context, string) int { return 1 }, name: "default", rep: ratefields.NewReporter(l)}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithKey sets how a call's key is found. Default: ClientIP() on the
// server, Method on the client.
func WithKey(f KeyFunc) Option { return func(c *config) { c.key = f } }

// WithCost charges f(ctx, fullMethod) units per call instead of 1.
func WithCost(f func(ctx context.Context, fullMethod string) int) Option {
	return func(c *config) { c.cost = f }
}

// WithFailOpen lets calls through when the limiter's backend is
// unavailable (an error wrapping throttle.ErrUnavailable) instead of
// refusing them with codes.Unavailable.
func WithFailOpen() Option { return func(c *config) { c.failOpen = true } }

// WithSkip exempts the methods for which f returns true (health checks,
// reflection).
func WithSkip(f func(fullMethod string) bool) Option { return func(c *config) { c.skip = f } }

// WithName names the policy in the ratelimit-policy and ratelimit metadata
// (default "default").
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithLegacyHeaders adds x-ratelimit-limit, x-ratelimit-remaining and
// x-ratelimit-reset, for clients that read only those.
func WithLegacyHeaders() Option { return func(c *config) { c.legacy = true } }

// WithFailFast makes a client interceptor refuse a call over the limit at
// once, with the same status a server would send, instead of waiting.
func WithFailFast() Option { return func(c *config) { c.failFast = true } }

// acquire asks l for the call's units. It returns the release func (never
// nil), the metadata to send, and the status error that refuses the call,
// if any.
func (c *config) acquire(ctx context.Context, l throttle.Limiter, method string) (release func(), md metadata.MD, err error) {
	release = func() {}
	key, err := c.keyOf(ctx, method)
	if err != nil {
		return release, nil, err
	}
	d, release, err := throttle.TryHold(ctx, l, key, c.cost(ctx, method))
	if err != nil {
		if c.failOpen && errors.Is(err, throttle.ErrUnavailable) {
			return release, nil, nil
		}
		return release, nil, statusOf(err)
	}
	md = c.headers(key, d)
	if !d.Allowed {
		return release, md, Denied(d)
	}
	return release, md, nil
}

// keyOf runs the key func, turning its error into a status.
func (c *config) keyOf(ctx context.Context, method string) (string, error) {
	key, err := c.key(ctx, method)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return "", err
		}
		return "", status.Errorf(codes.InvalidArgument, "grpclimit: key: %v", err)
	}
	return key, nil
}

// Denied returns the status error of a call refused by d:
// codes.ResourceExhausted with a RetryInfo detail holding d.RetryAfter,
// or without one when d states no time (a full concurrency limit, where
// waiting frees nothing: the client backs off as it sees fit).
func Denied(d throttle.Decision) error {
	if d.RetryAfter <= 0 {
		return status.Error(codes.ResourceExhausted, "limited, no time stated")
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limited, retry after %v", d.RetryAfter))
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = ds
	}
	return st.Err()
}

// statusOf maps a limiter's error to a status.
func statusOf(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, throttle.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, throttle.ErrDenied):
		code = codes.PermissionDenied
	case errors.Is(err, throttle.ErrExceedsLimit):
		code = codes.ResourceExhausted // no RetryInfo: retrying cannot help
	case errors.Is(err, throttle.ErrInvalid):
		code = codes.InvalidArgument
	}
	return status.Error(code, err.Error())
}

// headers returns the rate-limit metadata of d for key (nil for a key
// that is not limited).
func (c *config) headers(key string, d throttle.Decision) metadata.MD {
	q, t, limited := c.rep.State(key, d)
	if !limited {
		return nil
	}
	md := metadata.MD{
		"ratelimit-policy": {ratefields.Policy(c.name, q)},
		"ratelimit":        {ratefields.Limit(c.name, d.Remaining, t)},
	}
	if c.legacy {
		md["x-ratelimit-limit"] = []string{strconv.Itoa(q.Limit)}
		md["x-ratelimit-remaining"] = []string{strconv.Itoa(max(d.Remaining, 0))}
		md["x-ratelimit-reset"] = []string{strconv.FormatInt(ratefields.Seconds(t), 10)}
	}
	if !d.Allowed && d.RetryAfter > 0 {
		md["retry-after"] = []string{strconv.FormatInt(ratefields.Seconds(d.RetryAfter), 10)}
	}
	return md
}

// RetryDelay returns the retry delay a refused call's status carries, and
// whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}
