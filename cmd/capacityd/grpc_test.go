package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/throttlekit/throttle/distributed/capacity"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
	"github.com/throttlekit/throttle/internal/certtest"
)

const getCapacityMethod = "/throttle.capacity.v1.CapacityService/GetCapacity"

// grpcConn dials addr with grpc-go; it closes with the test.
func grpcConn(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// getCapacity asks for wants of resource "db" as client.
func getCapacity(conn *grpc.ClientConn, client string, wants float64) (*capacityv1.GetCapacityResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := new(capacityv1.GetCapacityResponse)
	err := conn.Invoke(ctx, getCapacityMethod, &capacityv1.GetCapacityRequest{ClientId: client,
		Resources: []*capacityv1.ResourceRequest{{ResourceId: "db", Wants: wants}}}, out)
	return out, err
}

// TestGRPCListen: the grpc_listen port serves the wire API with grpc-go:
// grants once learning is over, InvalidArgument for a bad request, a
// refusal of a bad resource on its own, all counted in the metrics like
// the listen port's calls.
func TestGRPCListen(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	conn := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	eventually(t, "a grant of 10 over gRPC", func() bool {
		out, err := getCapacity(conn, "alice", 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(out.GetGrants()) == 1 && out.GetGrants()[0].GetCapacity() == 10 && out.GetGrants()[0].GetLease().AsDuration() == time.Second
	})
	if _, err := getCapacity(conn, "", 1); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no client id: %v, want InvalidArgument", err)
	}
	out, err := getCapacity(conn, "alice", -1)
	if err != nil || len(out.GetGrants()) != 1 || out.GetGrants()[0].GetCode() != capacityv1.ResourceCode_RESOURCE_CODE_INVALID_ARGUMENT {
		t.Fatalf("wants -1: %v, %v; want the resource refused as invalid", out, err)
	}
	_, body := a.get(t, a.adminURL()+"/metrics")
	for _, want := range []string{`capacityd_requests_total{method="GetCapacity"}`, `capacityd_request_errors_total{code="invalid_argument",method="GetCapacity"} 1`,
		`capacityd_refusals_total{reason="invalid_argument"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// TestGRPCAuth: behind mTLS the grpc_listen port acts only for the
// certificate's client id, and refuses callers without a certificate.
func TestGRPCAuth(t *testing.T) {
	ca := certtest.New(t)
	dir := t.TempDir()
	caFile := ca.WriteCA(t, dir, "ca")
	srvCert, srvKey := certtest.WriteFiles(t, dir, "server", ca.Issue(t, "server", ""))
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
		"auth": {"cert_file": "`+srvCert+`", "key_file": "`+srvKey+`", "client_ca_file": "`+caFile+`"},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	addr := a.grpcLn.Addr().String()
	alice := grpcConn(t, addr, credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, "alice", "")}}))
	if _, err := getCapacity(alice, "alice", 10); err != nil {
		t.Fatalf("alice as alice: %v", err)
	}
	if _, err := getCapacity(alice, "bob", 10); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("alice as bob: %v, want PermissionDenied", err)
	}
	anon := grpcConn(t, addr, credentials.NewTLS(&tls.Config{RootCAs: ca.Pool}))
	if _, err := getCapacity(anon, "alice", 10); err == nil {
		t.Fatal("a caller without a certificate was answered")
	}
	plain := grpcConn(t, addr, insecure.NewCredentials())
	if _, err := getCapacity(plain, "alice", 10); err == nil {
		t.Fatal("a plain-text caller was answered")
	}

	// Bearer tokens, as authorization metadata, without client certificates.
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"carol": "carol-token-0123456789"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
		"auth": {"cert_file": "`+srvCert+`", "key_file": "`+srvKey+`", "tokens_file": "`+tokens+`"},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	dial := func(token string) *grpc.ClientConn {
		conn, err := grpc.NewClient(b.grpcLn.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool})),
			grpc.WithPerRPCCredentials(bearer(token)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	if _, err := getCapacity(dial("carol-token-0123456789"), "carol", 10); err != nil {
		t.Fatalf("carol's token as carol: %v", err)
	}
	if _, err := getCapacity(dial("carol-token-0123456789"), "dave", 10); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("carol's token as dave: %v, want PermissionDenied", err)
	}
	if _, err := getCapacity(dial("forged-token-0123456789"), "carol", 10); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a forged token: %v, want Unauthenticated", err)
	}
}

// bearer sends a bearer token with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// TestGRPCSharesConnectionBound: the connections of both API ports count
// toward one max_connections, so the second port cannot take file
// descriptors beyond it.
func TestGRPCSharesConnectionBound(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", "http": {"max_connections": 4},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	var held []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", a.apiLn.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // accepted
	conn := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	if _, err := getCapacity(conn, "alice", 10); err == nil {
		t.Fatal("answered over a fifth connection")
	}
	for _, c := range held {
		c.Close()
	}
	eventually(t, "an answer once the others closed", func() bool {
		_, err := getCapacity(conn, "alice", 10)
		return err == nil
	})
}

// grpcTrickleHead is what a client sends to start a GetCapacity call whose
// request it then trickles: the HTTP/2 preface, SETTINGS, the call's
// HEADERS, and the start of a DATA frame of 16 KiB with the gRPC prefix of
// a message that fills it. Every zero byte sent after it is the message's.
func grpcTrickleHead(t *testing.T) string {
	t.Helper()
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", getCapacityMethod},
		{":authority", "capacityd"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	const size = 16384                                                     // the default maximum frame size
	b.Write([]byte{0, size >> 8, 0, byte(http2.FrameData), 0, 0, 0, 0, 1}) // the DATA frame's header, of stream 1
	b.Write([]byte{0, 0, 0, (size - 5) >> 8, (size - 5) & 0xff})           // uncompressed, of size-5 bytes
	return b.String()
}

// TestGRPCTrickle: calls that trickle their requests on the grpc_listen
// port, filling max_connections, lose their connections once
// read_timeout has passed since the call started (counted in the
// metrics), and the API is answered again on both ports. A call of an
// unknown method or of an oversized request, refused at once, is not cut.
func TestGRPCTrickle(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
		"http": {"read_header_timeout": "500ms", "read_timeout": "1s", "max_connections": 5},
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	conn := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	// A call of a method the port does not serve ends at once, unread:
	// it must not count as trickled.
	if err := conn.Invoke(context.Background(), "/throttle.capacity.v1.CapacityService/Nope", new(capacityv1.GetCapacityRequest),
		new(capacityv1.GetCapacityResponse)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("an unknown method: %v, want Unimplemented", err)
	}
	// Nor a call refused for its size, before its handler is called.
	if _, err := getCapacity(conn, strings.Repeat("x", capacity.MaxRequestBytes), 1); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("an oversized request: %v, want ResourceExhausted", err)
	}
	stop := make(chan struct{})
	defer close(stop)
	head := grpcTrickleHead(t)
	t0 := time.Now()
	var conns []<-chan struct{}
	for range 4 {
		conns = append(conns, trickle(t, a.grpcLn.Addr().String(), head, 0, stop))
	}
	late := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := late.Invoke(ctx, getCapacityMethod, &capacityv1.GetCapacityRequest{ClientId: "alice",
		Resources: []*capacityv1.ResourceRequest{{ResourceId: "db", Wants: 1}}}, new(capacityv1.GetCapacityResponse)); err == nil {
		t.Fatal("answered while the trickling calls hold every connection")
	}
	allClosed(t, conns, t0, 2500*time.Millisecond) // read_timeout and slack
	eventually(t, "GetCapacity answers over gRPC", func() bool {
		_, err := getCapacity(late, "alice", 10)
		return err == nil
	})
	eventually(t, "GetCapacity answers on the listen port", func() bool { return a.answers("bob") })
	_, body := a.get(t, a.adminURL()+"/metrics")
	if _, n, _ := strings.Cut(body, "\ncapacityd_grpc_request_timeouts_total "); !strings.HasPrefix(n, "4\n") {
		t.Errorf("capacityd_grpc_request_timeouts_total %.3q, want exactly the 4 connections closed", n)
	}
}

// BenchmarkGRPCGetCapacity: GetCapacity calls of parallel callers, each a
// client of its own, on one connection to the grpc_listen port.
func BenchmarkGRPCGetCapacity(b *testing.B) {
	a := startTest(b, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
		"resources": [{"id": "*", "capacity": 1000000, "lease_length": "1m", "refresh_interval": "10s"}]}`)
	conn := grpcConn(b, a.grpcLn.Addr().String(), insecure.NewCredentials())
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		client := "c" + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			if _, err := getCapacity(conn, client, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGRPCHandler: the grpc_listen port's GetCapacity handler without
// the transport, as grpc-go runs it: the request decoded from its bytes,
// the call, the metrics and the answer encoded, with grpc-go's proto codec
// and with the server's. 100 clients each want 15 of 1000, so that every
// answer comes out of a division, as in the comparison with Doorman.
func BenchmarkGRPCHandler(b *testing.B) {
	a := startTest(b, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
		"resources": [{"id": "*", "capacity": 1000, "algorithm": "fair_share", "lease_length": "1m", "refresh_interval": "10s"}]}`)
	api := &grpcAPI{svc: capacity.WireService(a.srv), met: a.met}
	handler := grpcDesc.Methods[0].Handler
	for _, codec := range []encoding.CodecV2{protoCodec, grpcCodec{}} {
		name := "codec=grpc-go"
		if _, ok := codec.(grpcCodec); ok {
			name = "codec=capacityd"
		}
		b.Run(name, func(b *testing.B) {
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				in, err := proto.Marshal(&capacityv1.GetCapacityRequest{ClientId: "c" + strconv.FormatInt(n.Add(1)%100, 10),
					Resources: []*capacityv1.ResourceRequest{{ResourceId: "db", Wants: 15}}})
				if err != nil {
					b.Error(err)
					return
				}
				dec := func(m any) error { return codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(in)}, m) }
				for pb.Next() {
					out, err := handler(api, context.Background(), dec, nil)
					if err == nil {
						var data mem.BufferSlice
						data, err = codec.Marshal(out)
						data.Free()
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestRecvDeadlineQueue: one timer per connection closes it at the
// deadline of the oldest call still waiting for its request, not at the
// deadline of a call that received its request before, nor for a call
// that ended without it.
func TestRecvDeadlineQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cuts atomic.Int32
		l := &recvDeadline{read: 100 * time.Millisecond, cut: func() { cuts.Add(1) }}
		a, b := net.Pipe()
		defer b.Close()
		c := &deadlineConn{Conn: a, l: l}
		call := func(ctx context.Context) *waitingCall {
			w := &waitingCall{Context: ctx, c: c, start: time.Now()}
			c.push(w)
			return w
		}
		ended, end := context.WithCancel(context.Background())
		call(ended) // refused without a handler: grpc-go ends it
		end()
		first := call(context.Background())
		time.Sleep(10 * time.Millisecond)
		requestReceived(first)
		time.Sleep(50 * time.Millisecond)
		call(context.Background()) // trickles from 60 ms
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if n := cuts.Load(); n != 0 {
			t.Fatalf("closed %d times at 159 ms, before the waiting call's deadline (160 ms)", n)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if n := cuts.Load(); n != 1 {
			t.Fatalf("closed %d times at 161 ms, want once at the waiting call's deadline", n)
		}
	})
}

// BenchmarkRecvDeadline: what the read deadline costs a call, its tap and
// requestReceived.
func BenchmarkRecvDeadline(b *testing.B) {
	c1, c2 := net.Pipe()
	defer c2.Close()
	l := &recvDeadline{Listener: oneConn{c1}, read: time.Minute, cut: func() {}}
	c, err := l.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: c.RemoteAddr()})
	info := &tap.Info{FullMethodName: getCapacityMethod}
	b.ReportAllocs()
	for b.Loop() {
		call, err := l.tap(ctx, info)
		if err != nil {
			b.Fatal(err)
		}
		requestReceived(call)
	}
}

// oneConn is a listener that accepts its connection, once.
type oneConn struct{ c net.Conn }

func (l oneConn) Accept() (net.Conn, error) { return l.c, nil }
func (l oneConn) Close() error              { return nil }
func (l oneConn) Addr() net.Addr            { return l.c.LocalAddr() }
