package envoyrls

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codecRequests are requests of every shape the codec decodes itself or
// leaves to the proto codec, encoded.
func codecRequests(t testing.TB) [][]byte {
	override := desc("k", "v")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	negative := desc("k", "v")
	negative.IsNegativeHits = true
	msgs := []*rlsv3.RateLimitRequest{
		{},
		req("d"),
		req("d", desc("k", "v")),
		req("d", desc("a", "1", "b", "2"), desc(), withHits(desc("c", ""), 0), withHits(desc("é", "ü"), 1<<40), override),
		{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v"), {}}},
		{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{}, HitsAddend: &wrapperspb.UInt64Value{}}}},
		req("d", negative),
	}
	var out [][]byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	good, _ := proto.Marshal(req("d", desc("k", "v")))
	entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff") // a key not UTF-8
	bad := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry))
	return append(out,
		append(slices.Clone(good), good...),                            // every field twice: the domain's last, the descriptors of both
		append(slices.Clone(good), 0x98, 0x06, 0x01),                   // an unknown field (99)
		append(slices.Clone(good), 0x18, 0x80, 0x80, 0x80, 0x80, 0x10), // hits_addend over 32 bits
		good[:len(good)-1], // truncated
		bad,
		[]byte{0x0a, 0x01, 0xff}, // a domain not UTF-8
	)
}

// checkDecode fails t unless the server's codec decodes b as the proto
// codec does: the same message, or an error for both.
func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	got, want := new(rlsv3.RateLimitRequest), new(rlsv3.RateLimitRequest)
	gerr := serverCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
	werr := proto.Unmarshal(b, want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("% x: codec error %v, proto's %v", b, gerr, werr)
	}
	if werr == nil && !proto.Equal(got, want) {
		t.Fatalf("% x: codec decoded %v, proto %v", b, got, want)
	}
}

func TestCodecDecodesRequests(t *testing.T) {
	for _, b := range codecRequests(t) {
		checkDecode(t, b)
	}
	r := new(rlsv3.RateLimitRequest)
	typical, _ := proto.Marshal(req("d", desc("a", "1", "b", "2"), withHits(desc("c", "3"), 2)))
	if !decodeRequest(typical, r) {
		t.Fatal("a typical request was left to the proto codec")
	}
}

func FuzzCodecDecodesRequests(f *testing.F) {
	for _, b := range codecRequests(f) {
		f.Add(b)
	}
	f.Fuzz(checkDecode)
}

// TestCodecEncodesResponses checks the server's codec writes the proto
// codec's bytes for the responses the service gives and for random ones.
func TestCodecEncodesResponses(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rs := []*rlsv3.RateLimitResponse{{}, failOpen(3)}
	for range 500 {
		r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(3))}
		for range rng.IntN(5) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(3) - rng.IntN(2)), LimitRemaining: rng.Uint32() >> rng.IntN(33)}
			if rng.IntN(4) > 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: []string{"", "n", "名前"}[rng.IntN(3)],
					RequestsPerUnit: rng.Uint32() >> rng.IntN(33), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(8))}
			}
			if rng.IntN(4) > 0 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: rng.Int64N(1<<40) - rng.Int64N(3), Nanos: rng.Int32N(1e9) - rng.Int32N(3)}
			}
			r.Statuses = append(r.Statuses, st)
		}
		for range rng.IntN(3) {
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "k" + string(rune('a'+rng.IntN(3))), Value: []string{"", "1", "x y"}[rng.IntN(3)]})
		}
		rs = append(rs, r)
	}
	rs = append(rs, // left to the proto codec
		&rlsv3.RateLimitResponse{RawBody: []byte("b")},
		&rlsv3.RateLimitResponse{DynamicMetadata: &structpb.Struct{}},
		&rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		&rlsv3.RateLimitResponse{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", RawValue: []byte("v")}}})
	for _, r := range rs {
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := serverCodec.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if b := got.Materialize(); !bytes.Equal(b, want) {
			t.Fatalf("%v: codec wrote\n% x, proto\n% x", r, b, want)
		}
		got.Free()
	}
}
