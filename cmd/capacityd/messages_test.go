package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/throttlekit/throttle/distributed/capacity"
)

// rawCodec sends a []byte as the message as it is, for requests no
// protobuf library would marshal.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// deepJSON is a JSON value of depth nested arrays.
func deepJSON(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// deepGroups is a GetCapacityRequest (client "a", 1 of "db") followed by
// an unknown field of depth nested groups.
func deepGroups(depth int) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "a")
	var rr []byte
	rr = protowire.AppendTag(rr, 1, protowire.BytesType)
	rr = protowire.AppendString(rr, "db")
	rr = protowire.AppendTag(rr, 2, protowire.Fixed64Type)
	rr = protowire.AppendFixed64(rr, math.Float64bits(1))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, rr)
	for range depth {
		b = protowire.AppendTag(b, 99, protowire.StartGroupType)
	}
	for range depth {
		b = protowire.AppendTag(b, 99, protowire.EndGroupType)
	}
	return b
}

// TestHostileMessages: oversized and deeply nested requests on both API
// ports get a clear refusal at once, and the server goes on answering.
func TestHostileMessages(t *testing.T) {
	a := startTest(t, `{"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
		"resources": [{"id": "*", "capacity": 30, "lease_length": "1s", "refresh_interval": "200ms"}]}`)
	url := a.apiURL() + getCapacityMethod
	big := `{"clientId":"a","resources":[{"resourceId":"` + strings.Repeat("x", capacity.MaxRequestBytes) + `","wants":1}]}`
	for _, c := range []struct {
		name, ctype string
		body        io.Reader
		code        int
		says        string
	}{
		{"oversized JSON", "application/json", strings.NewReader(big), 413, "larger than"},
		{"oversized JSON, chunked", "application/json", io.MultiReader(strings.NewReader(big)), 400, "larger than"},
		{"deeply nested JSON", "application/json", strings.NewReader(`{"clientId":"a","resources":` + deepJSON(200_000) + `}`), 400, "invalid_argument"},
		{"deeply nested JSON, unknown field", "application/json", strings.NewReader(`{"clientId":"a","x":` + deepJSON(200_000) + `}`), 400, "invalid_argument"},
		{"nested protobuf", "application/proto", bytes.NewReader(deepGroups(100)), 200, ""},
		{"deeply nested protobuf", "application/proto", bytes.NewReader(deepGroups(200_000)), 400, "invalid_argument"},
	} {
		t0 := time.Now()
		resp, err := a.hc.Post(url, c.ctype, c.body)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.says) {
			t.Errorf("%s: %d %.200s, want %d saying %q", c.name, resp.StatusCode, b, c.code, c.says)
		}
		t.Logf("listen, %s: %d in %v", c.name, resp.StatusCode, time.Since(t0).Round(time.Millisecond))
	}
	if !a.answers("b") {
		t.Fatal("no answer on the listen port after the hostile messages")
	}

	conn := grpcConn(t, a.grpcLn.Addr().String(), insecure.NewCredentials())
	for _, c := range []struct {
		name string
		msg  []byte
		code codes.Code
	}{
		{"oversized protobuf", bytes.Repeat([]byte{0}, capacity.MaxRequestBytes+1), codes.ResourceExhausted},
		{"nested protobuf", deepGroups(100), codes.OK},
		{"deeply nested protobuf", deepGroups(200_000), codes.InvalidArgument},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var out []byte
		err := conn.Invoke(ctx, getCapacityMethod, &c.msg, &out, grpc.ForceCodec(rawCodec{}))
		cancel()
		if status.Code(err) != c.code {
			t.Errorf("grpc_listen, %s: %v, want %v", c.name, err, c.code)
		}
		t.Logf("grpc_listen, %s: %v", c.name, err)
	}
	if _, err := getCapacity(conn, "c", 1); err != nil {
		t.Fatalf("no answer on grpc_listen after the hostile messages: %v", err)
	}
}
