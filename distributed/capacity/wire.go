package capacity

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttle"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
	"github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1/capacityv1connect"
)

// MaxRequestBytes caps the size of a request the handler reads.
const MaxRequestBytes = 1 << 20

// NewHandler returns one http.Handler serving s over the wire API
// (service throttle.capacity.v1.CapacityService) in the gRPC, gRPC-Web
// and Connect protocols, the last with JSON or binary bodies, so that
// curl works:
//
//	curl -H 'Content-Type: application/json' \
//	  -d '{"clientId":"c1","resources":[{"resourceId":"db","wants":10}]}' \
//	  http://127.0.0.1:8080/throttle.capacity.v1.CapacityService/GetCapacity
//
// gRPC needs HTTP/2: serve it with TLS, or over cleartext with an
// http.Server whose Protocols allow unencrypted HTTP/2. Bad requests get
// code InvalidArgument, a full server ResourceExhausted; requests above
// MaxRequestBytes, as sent or once decompressed, are refused with
// InvalidArgument (HTTP 413 for a Connect request whose Content-Length
// says so) without reading (or inflating) more than that. opts are
// added to the handler's options.
func NewHandler(s *Server, opts ...connect.HandlerOption) http.Handler {
	mux := http.NewServeMux()
	path, h := capacityv1connect.NewCapacityServiceHandler(wireServer{s},
		// The bounds are boundBody's and boundedGzip's: connect's own
		// would answer ResourceExhausted, after inflating everything.
		append([]connect.HandlerOption{connect.WithCompressMinBytes(4096),
			connect.WithCompression("gzip", newBoundedGzip, func() connect.Compressor { return gzip.NewWriter(nil) })}, opts...)...)
	mux.Handle(path, boundBody(h))
	return mux
}

// maxBodyBytes is the longest body read: a message and a gRPC envelope.
const maxBodyBytes = MaxRequestBytes + 5

var connTooLarge = connect.NewError(connect.CodeInvalidArgument, errTooLarge)

// boundBody refuses a body above maxBodyBytes: at once with 413 for a
// Connect request that says its length, otherwise when the handler reads
// past the bound.
func boundBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxBodyBytes && !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": "invalid_argument", "message": errTooLarge.Error()})
			return
		}
		r.Body = &boundedReader{r: r.Body, c: r.Body, left: maxBodyBytes}
		h.ServeHTTP(w, r)
	})
}

// boundedReader reads at most left bytes of r; one more is errTooLarge.
type boundedReader struct {
	r    io.Reader
	c    io.Closer
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			return 0, connTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedReader) Close() error { return b.c.Close() }

// boundedGzip inflates at most MaxRequestBytes: a small body that would
// inflate to more is refused after that much work, not after all of it.
type boundedGzip struct {
	z gzip.Reader
	boundedReader
}

func newBoundedGzip() connect.Decompressor {
	d := &boundedGzip{}
	d.boundedReader = boundedReader{r: &d.z, c: &d.z}
	return d
}

func (d *boundedGzip) Reset(r io.Reader) error {
	d.left = MaxRequestBytes
	return d.z.Reset(r)
}

type wireServer struct{ s *Server }

var _ capacityv1connect.CapacityServiceHandler = wireServer{}

// wireError turns a server error into a Connect error with its code.
func wireError(err error) error {
	switch {
	case errors.Is(err, throttle.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, ErrExhausted):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func (w wireServer) GetCapacity(ctx context.Context, in *connect.Request[capacityv1.GetCapacityRequest]) (*connect.Response[capacityv1.GetCapacityResponse], error) {
	m := in.Msg
	if err := authorize(ctx, m.GetClientId()); err != nil {
		return nil, err
	}
	if len(m.GetResources()) > maxRequestResources {
		return nil, wireError(invalidf("a request carries 1 to %d resources, got %d", maxRequestResources, len(m.GetResources())))
	}
	resp, err := w.s.GetCapacity(ctx, fromWire(m))
	if err != nil {
		return nil, wireError(err)
	}
	return connect.NewResponse(toWire(resp)), nil
}

// fromWire returns the Request of m. A request of one resource, the
// common case, takes one allocation.
func fromWire(m *capacityv1.GetCapacityRequest) *Request {
	var req *Request
	if rs := m.GetResources(); len(rs) == 1 {
		b := new(struct {
			req Request
			one [1]ResourceRequest
		})
		req = &b.req
		req.Resources = b.one[:]
	} else {
		req = &Request{Resources: make([]ResourceRequest, len(rs))}
	}
	req.Client, req.Incarnation, req.Sequence = m.GetClientId(), m.GetIncarnation(), m.GetSequence()
	for i, r := range m.GetResources() {
		req.Resources[i] = ResourceRequest{Resource: r.GetResourceId(), Wants: r.GetWants(), Has: r.GetHas(), Priority: r.GetPriority(), Weight: r.GetWeight(), Token: r.GetLeaseToken()}
	}
	return req
}

// wireGrant is a Grant message and its two durations, allocated together.
type wireGrant struct {
	g              capacityv1.Grant
	lease, refresh durationpb.Duration
}

// toWire returns the message of resp. An answer of one grant, the common
// case, takes one allocation; others three.
func toWire(resp *Response) *capacityv1.GetCapacityResponse {
	var (
		out  *capacityv1.GetCapacityResponse
		ptrs []*capacityv1.Grant
		gs   []wireGrant
	)
	if len(resp.Grants) == 1 {
		b := new(struct {
			out  capacityv1.GetCapacityResponse
			ptrs [1]*capacityv1.Grant
			gs   [1]wireGrant
		})
		out, ptrs, gs = &b.out, b.ptrs[:], b.gs[:]
	} else {
		out, ptrs, gs = new(capacityv1.GetCapacityResponse), make([]*capacityv1.Grant, len(resp.Grants)), make([]wireGrant, len(resp.Grants))
	}
	out.Redirect, out.MasterAddress, out.Stale, out.Incarnation = resp.Redirect, resp.Master, resp.Stale, resp.Incarnation
	if len(resp.Grants) > 0 {
		out.Grants = ptrs
	}
	for i, g := range resp.Grants {
		w := &gs[i]
		setDuration(&w.lease, g.Lease)
		setDuration(&w.refresh, g.Refresh)
		w.g.ResourceId, w.g.Capacity, w.g.SafeCapacity = g.Resource, g.Capacity, g.SafeCapacity
		w.g.Lease, w.g.RefreshInterval, w.g.LeaseToken = &w.lease, &w.refresh, g.Token
		if g.Err != nil {
			w.g.Code, w.g.Error = wireResourceCode(g.Err), g.Err.Error()
		}
		ptrs[i] = &w.g
	}
	return out
}

// setDuration sets p to d, as durationpb.New does.
func setDuration(p *durationpb.Duration, d time.Duration) {
	p.Seconds, p.Nanos = int64(d/time.Second), int32(d%time.Second)
}

func (w wireServer) ReleaseCapacity(ctx context.Context, in *connect.Request[capacityv1.ReleaseCapacityRequest]) (*connect.Response[capacityv1.ReleaseCapacityResponse], error) {
	if err := authorize(ctx, in.Msg.GetClientId()); err != nil {
		return nil, err
	}
	resp, err := w.s.Release(ctx, &ReleaseRequest{Client: in.Msg.GetClientId(), Resources: in.Msg.GetResourceIds(),
		Incarnation: in.Msg.GetIncarnation(), Sequence: in.Msg.GetSequence()})
	if err != nil {
		return nil, wireError(err)
	}
	return connect.NewResponse(&capacityv1.ReleaseCapacityResponse{Redirect: resp.Redirect, MasterAddress: resp.Master}), nil
}

func (w wireServer) GetStatus(context.Context, *connect.Request[capacityv1.GetStatusRequest]) (*connect.Response[capacityv1.GetStatusResponse], error) {
	st := w.s.Status()
	out := &capacityv1.GetStatusResponse{MasterAddress: st.Leadership.Master, IsMaster: st.Leadership.IsMaster, Term: st.Leadership.Term}
	for _, r := range st.Resources {
		out.Resources = append(out.Resources, &capacityv1.ResourceStatus{
			Id: r.ID, Template: r.Template, Capacity: r.Capacity, Algorithm: r.Algorithm.String(),
			Learning: r.Learning, Clients: int32(r.Clients), Wants: r.Wants, Held: r.Held,
		})
	}
	return connect.NewResponse(out), nil
}

// HTTPTransport is the Transport of the wire API: it calls servers served
// by NewHandler. Addresses are "host:port" (plain HTTP, or HTTPS when
// the transport was made with NewTLSTransport) or URLs
// ("https://host:port"). The protocol follows the client options: Connect
// with binary protobuf by default, connect.WithGRPC() for gRPC (HTTP/2
// needed), connect.WithProtoJSON() for JSON. It is safe for concurrent
// use.
type HTTPTransport struct {
	hc     connect.HTTPClient
	opts   []connect.ClientOption
	scheme string // of "host:port" addresses

	mu      sync.Mutex
	clients map[string]capacityv1connect.CapacityServiceClient
}

var _ Transport = (*HTTPTransport)(nil)

// maxTransportAddrs bounds the per-address clients an HTTPTransport keeps.
const maxTransportAddrs = 64

// NewHTTPTransport returns a transport sending requests with hc (nil
// means http.DefaultClient).
func NewHTTPTransport(hc connect.HTTPClient, opts ...connect.ClientOption) *HTTPTransport {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &HTTPTransport{hc: hc, opts: opts, scheme: "http://", clients: map[string]capacityv1connect.CapacityServiceClient{}}
}

// NewTLSTransport returns a transport calling servers over HTTPS (HTTP/2
// or HTTP/1.1) with cfg: its RootCAs verify the servers, and its
// Certificates authenticate the client to a handler behind Authenticated
// with CertificateIdentity (the client's id must then be the
// certificate's identity, or below it). "host:port" addresses, redirects
// included, are called over HTTPS. opts are as for NewHTTPTransport, such
// as WithBearerToken.
func NewTLSTransport(cfg *tls.Config, opts ...connect.ClientOption) *HTTPTransport {
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg.Clone(), ForceAttemptHTTP2: true}}
	t := NewHTTPTransport(hc, opts...)
	t.scheme = "https://"
	return t
}

func (t *HTTPTransport) client(addr string) capacityv1connect.CapacityServiceClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.clients[addr]
	if c == nil {
		if len(t.clients) >= maxTransportAddrs {
			// Addresses come from redirects too: do not let them grow
			// without bound.
			clear(t.clients)
		}
		url := addr
		if !strings.Contains(addr, "://") {
			url = t.scheme + addr
		}
		c = capacityv1connect.NewCapacityServiceClient(t.hc, url, t.opts...)
		t.clients[addr] = c
	}
	return c
}

// wireResourceCode is the wire code of the refusal of one resource.
func wireResourceCode(err error) capacityv1.ResourceCode {
	if errors.Is(err, ErrExhausted) {
		return capacityv1.ResourceCode_RESOURCE_CODE_RESOURCE_EXHAUSTED
	}
	return capacityv1.ResourceCode_RESOURCE_CODE_INVALID_ARGUMENT
}

// grantError maps the refusal of one resource on the wire back to an
// error wrapping ErrResourceRefused and the matching sentinel; nil for
// a grant.
func grantError(addr string, g *capacityv1.Grant) error {
	kind := throttle.ErrInvalid // and for a code this version does not know
	switch g.GetCode() {
	case capacityv1.ResourceCode_RESOURCE_CODE_OK:
		return nil
	case capacityv1.ResourceCode_RESOURCE_CODE_RESOURCE_EXHAUSTED:
		kind = ErrExhausted
	}
	return &resourceError{kind: kind, msg: fmt.Sprintf("capacity: %s: resource %q refused: %s", addr, g.GetResourceId(), g.GetError())}
}

// clientError maps a wire error back to this package's sentinels.
func clientError(addr string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		return fmt.Errorf("%w: capacity: %s: %v", throttle.ErrInvalid, addr, err)
	case connect.CodeResourceExhausted:
		return fmt.Errorf("%w: %s: %v", ErrExhausted, addr, err)
	case connect.CodeUnauthenticated:
		return fmt.Errorf("%w: %s: %v", ErrUnauthenticated, addr, err)
	case connect.CodePermissionDenied:
		return fmt.Errorf("%w: %s: %v", ErrForbidden, addr, err)
	}
	return fmt.Errorf("%w: capacity: %s: %v", throttle.ErrUnavailable, addr, err)
}

// GetCapacity calls GetCapacity on the server at addr.
func (t *HTTPTransport) GetCapacity(ctx context.Context, addr string, req *Request) (*Response, error) {
	m := &capacityv1.GetCapacityRequest{ClientId: req.Client, Resources: make([]*capacityv1.ResourceRequest, len(req.Resources)),
		Incarnation: req.Incarnation, Sequence: req.Sequence}
	for i, r := range req.Resources {
		m.Resources[i] = &capacityv1.ResourceRequest{ResourceId: r.Resource, Wants: r.Wants, Has: r.Has, Priority: r.Priority, Weight: r.Weight, LeaseToken: r.Token}
	}
	out, err := t.client(addr).GetCapacity(ctx, connect.NewRequest(m))
	if err != nil {
		return nil, clientError(addr, err)
	}
	resp := &Response{Redirect: out.Msg.GetRedirect(), Master: out.Msg.GetMasterAddress(), Grants: make([]Grant, len(out.Msg.GetGrants())),
		Stale: out.Msg.GetStale(), Incarnation: out.Msg.GetIncarnation()}
	for i, g := range out.Msg.GetGrants() {
		resp.Grants[i] = Grant{Resource: g.GetResourceId(), Capacity: g.GetCapacity(), SafeCapacity: g.GetSafeCapacity(), Lease: wireDuration(g.GetLease()), Refresh: wireDuration(g.GetRefreshInterval()),
			Err: grantError(addr, g), Token: g.GetLeaseToken()}
	}
	return resp, nil
}

// wireDuration converts d, mapping an absent or invalid duration to 0,
// which the client refuses.
func wireDuration(d *durationpb.Duration) time.Duration {
	if d.CheckValid() != nil {
		return 0
	}
	return d.AsDuration()
}

// Release calls ReleaseCapacity on the server at addr.
func (t *HTTPTransport) Release(ctx context.Context, addr string, req *ReleaseRequest) (*Response, error) {
	out, err := t.client(addr).ReleaseCapacity(ctx, connect.NewRequest(&capacityv1.ReleaseCapacityRequest{ClientId: req.Client, ResourceIds: req.Resources,
		Incarnation: req.Incarnation, Sequence: req.Sequence}))
	if err != nil {
		return nil, clientError(addr, err)
	}
	return &Response{Redirect: out.Msg.GetRedirect(), Master: out.Msg.GetMasterAddress()}, nil
}

// WireService returns the wire API's methods on s, on the generated
// messages, for serving them with a gRPC server other than NewHandler's
// (capacityd serves them with grpc-go too). Errors are *connect.Error,
// whose codes are gRPC's. Behind authentication, call them with a context
// from WithIdentity.
func WireService(s *Server) capacityv1connect.CapacityServiceHandler { return wireServer{s} }
