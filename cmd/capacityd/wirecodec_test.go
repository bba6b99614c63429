package main

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttle"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
)

// codecRequests are requests of every field, for the fuzzers' corpus.
func codecRequests(t testing.TB) [][]byte {
	reqs := []*capacityv1.GetCapacityRequest{
		{},
		{ClientId: "client-042", Resources: []*capacityv1.ResourceRequest{{ResourceId: "benchmark", Wants: 15, Has: 10}}, Incarnation: 1765000000000000000, Sequence: 7},
		{ClientId: "c", Resources: []*capacityv1.ResourceRequest{
			{ResourceId: "a", Wants: 1, Has: math.Copysign(0, -1), Priority: -3, Weight: 0.5, LeaseToken: []byte{1, 2, 3}},
			{ResourceId: "b", Wants: math.NaN(), Priority: math.MaxInt32}, {}},
			Incarnation: -1, Sequence: math.MaxUint64},
	}
	var out [][]byte
	for _, r := range reqs {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	// Unknown fields of every wire type, and fields of the wrong type.
	var u []byte
	u = protowire.AppendTag(u, 9, protowire.Fixed32Type)
	u = protowire.AppendFixed32(u, 5)
	u = protowire.AppendTag(u, 1, protowire.VarintType)
	u = append(u, 0x80, 0x00) // a varint of two bytes for 0
	u = protowire.AppendTag(u, 3, protowire.BytesType)
	u = protowire.AppendString(u, "x")
	u = protowire.AppendTag(u, 2, protowire.BytesType)
	u = protowire.AppendBytes(u, u[:7])
	return append(out, u, deepGroups(100), deepGroups(20_000), []byte{0x0a, 0x02, 0xff, 0xfe})
}

// FuzzCodecRequest: grpc_listen's codec decodes a GetCapacityRequest as
// proto.Unmarshal does, errors included: the same messages, unknown
// fields kept, or an error (wrapping throttle.ErrInvalid) for the same
// inputs.
func FuzzCodecRequest(f *testing.F) {
	for _, b := range codecRequests(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := new(capacityv1.GetCapacityRequest)
		wantErr := proto.Unmarshal(data, want)
		got := new(capacityv1.GetCapacityRequest)
		err := grpcCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, got)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("%x: codec: %v, proto.Unmarshal: %v", data, err, wantErr)
		case err != nil && !errors.Is(err, throttle.ErrInvalid):
			t.Fatalf("%x: %v does not wrap ErrInvalid", data, err)
		case err == nil && !proto.Equal(got, want):
			t.Fatalf("%x: codec decoded %v, proto.Unmarshal %v", data, got, want)
		}
	})
}

// FuzzCodecResponse: grpc_listen's codec encodes a GetCapacityResponse in
// the bytes proto.Marshal writes, or fails where it fails (strings not
// UTF-8). The answer is built from the fuzzer's values, with, when extra
// decodes as a Grant, that grant (and its unknown fields) second.
func FuzzCodecResponse(f *testing.F) {
	grant, _ := proto.Marshal(&capacityv1.Grant{ResourceId: "db", Capacity: 10, Lease: durationpb.New(2e9), RefreshInterval: &durationpb.Duration{}})
	f.Add("benchmark", 10.0, int64(2), int32(0), int32(0), []byte(nil), "", int64(0), uint8(0), grant)
	f.Add("", math.Copysign(0, -1), int64(-1), int32(-5), int32(2), []byte{7}, "10.0.0.1:7400", int64(-9), uint8(15), []byte{0x1a, 0x02, 0x08, 0x01, 0x48, 0x01})
	f.Add(strings.Repeat("r", 200), 1.0, int64(1), int32(1), int32(1), bytes.Repeat([]byte{1}, 20000), strings.Repeat("m", 130), int64(1), uint8(1), grant)
	f.Add("\xff", math.Inf(1), int64(math.MinInt64), int32(math.MinInt32), int32(-1), []byte{}, "m", int64(1), uint8(3), []byte{0x0a, 0x01, 0x80})
	f.Fuzz(func(t *testing.T, id string, capacity float64, seconds int64, nanos, code int32, token []byte, master string, inc int64, flags uint8, extra []byte) {
		g := &capacityv1.Grant{ResourceId: id, Capacity: capacity, SafeCapacity: -capacity, Code: capacityv1.ResourceCode(code), Error: master, LeaseToken: token}
		if flags&1 != 0 {
			g.Lease = &durationpb.Duration{Seconds: seconds, Nanos: nanos}
		}
		if flags&2 != 0 {
			g.RefreshInterval = &durationpb.Duration{}
		}
		m := &capacityv1.GetCapacityResponse{Grants: []*capacityv1.Grant{g}, Redirect: flags&4 != 0, MasterAddress: master, Stale: flags&8 != 0, Incarnation: inc}
		if flags&16 != 0 {
			m.Grants = append(m.Grants, nil) // an empty message
		}
		if second := new(capacityv1.Grant); proto.Unmarshal(extra, second) == nil {
			m.Grants = append(m.Grants, second)
		}
		want, wantErr := proto.Marshal(m)
		got, err := grpcCodec{}.Marshal(m)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("%v: codec: %v, proto.Marshal: %v", m, err, wantErr)
		case err == nil && !bytes.Equal(got.Materialize(), want):
			t.Fatalf("%v: codec wrote %x, proto.Marshal %x", m, got.Materialize(), want)
		}
		got.Free()
	})
}

// TestCodecOtherMessages: the messages of the other methods go through
// grpc-go's proto codec.
func TestCodecOtherMessages(t *testing.T) {
	in := &capacityv1.ReleaseCapacityRequest{ClientId: "c", ResourceIds: []string{"a", "b"}, Sequence: 3}
	b, err := grpcCodec{}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	out := new(capacityv1.ReleaseCapacityRequest)
	if err := (grpcCodec{}).Unmarshal(b, out); err != nil || !proto.Equal(in, out) {
		t.Fatalf("round trip: %v, %v", out, err)
	}
	if _, err := (grpcCodec{}).Marshal(3); err == nil {
		t.Fatal("marshalled an int")
	}
}
