package main

import (
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttle"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
)

// grpcCodec is the codec of the grpc_listen server. GetCapacity's request
// and answer, the messages of nearly every call, it decodes and encodes
// itself with protowire: no reflection, and the answer in a pooled
// buffer. It hands every other message to grpc-go's proto codec. The
// bytes it writes are proto.Marshal's, and it decodes a request as
// proto.Unmarshal does: unknown fields kept, strings checked for UTF-8,
// the same errors for the same inputs (FuzzCodecRequest and
// FuzzCodecResponse compare them). It has no state: the zero value is
// ready, and it is safe for concurrent use.
type grpcCodec struct{}

var _ encoding.CodecV2 = grpcCodec{}

// protoCodec is grpc-go's codec of protobuf messages.
var protoCodec = encoding.GetCodecV2(grpcproto.Name)

// minPooledAnswer is the size of the buffer an answer is encoded into:
// grpc-go's pools keep buffers of 1 KiB and more only.
const minPooledAnswer = 1 << 10

// Name is the content subtype of the messages: gRPC's default, protobuf.
func (grpcCodec) Name() string { return grpcproto.Name }

// Marshal encodes v in a buffer of grpc-go's default pool, freed when
// grpc-go has written it.
func (grpcCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*capacityv1.GetCapacityResponse)
	if !ok {
		return protoCodec.Marshal(v)
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(minPooledAnswer)
	b, err := appendResponse((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v, a new message.
func (grpcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*capacityv1.GetCapacityRequest)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return decodeRequest(buf.ReadOnlyData(), m)
}

// The errors of bytes that do not decode, as proto.Unmarshal's.
var (
	errWireFormat = fmt.Errorf("%w: capacityd: cannot parse invalid wire-format data", throttle.ErrInvalid)
	errUTF8       = fmt.Errorf("%w: capacityd: string field contains invalid UTF-8", throttle.ErrInvalid)
)

// wireField is a field read from a message: its number, its wire type,
// its value (a varint or a fixed64 in u, bytes in b), and the value's
// bytes as received.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	u   uint64
	b   []byte
	raw []byte
}

// nextField reads the field at the start of b, and returns it and the
// bytes after it. Field numbers and values are checked as proto.Unmarshal
// checks them.
func nextField(b []byte) (f wireField, rest []byte, err error) {
	tag, n := protowire.ConsumeVarint(b)
	if n < 0 || tag>>3 < uint64(protowire.MinValidNumber) || tag>>3 > uint64(protowire.MaxValidNumber) {
		return f, nil, errWireFormat
	}
	f.num, f.typ = protowire.Number(tag>>3), protowire.Type(tag&7)
	b = b[n:]
	switch f.typ {
	case protowire.VarintType:
		f.u, n = protowire.ConsumeVarint(b)
	case protowire.Fixed64Type:
		f.u, n = protowire.ConsumeFixed64(b)
	case protowire.BytesType:
		f.b, n = protowire.ConsumeBytes(b)
	default: // Fixed32 and groups, in no field of these messages
		n = protowire.ConsumeFieldValue(f.num, f.typ, b)
	}
	if n < 0 {
		return f, nil, errWireFormat
	}
	f.raw = b[:n]
	return f, b[n:], nil
}

// keepUnknown appends f to the unknown fields of m, as proto.Unmarshal
// does: its tag re-encoded, then its value as received.
func keepUnknown(m protoreflect.ProtoMessage, f *wireField) {
	r := m.ProtoReflect()
	u := protowire.AppendTag(r.GetUnknown(), f.num, f.typ)
	r.SetUnknown(append(u, f.raw...))
}

// str returns f's bytes as a string, if they are UTF-8.
func (f *wireField) str() (string, error) {
	if !utf8.Valid(f.b) {
		return "", errUTF8
	}
	return string(f.b), nil
}

// decodeFields decodes the fields of b, the message m: field sets those
// of m's it knows (ok) and returns an error for a bad value; m keeps the
// others as unknown fields.
func decodeFields(b []byte, m protoreflect.ProtoMessage, field func(f wireField) (ok bool, err error)) error {
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		ok, err := field(f)
		if err != nil {
			return err
		}
		if !ok {
			keepUnknown(m, &f)
		}
	}
	return nil
}

// decodeRequest decodes b into m, a new message, as proto.Unmarshal does.
func decodeRequest(b []byte, m *capacityv1.GetCapacityRequest) error {
	return decodeFields(b, m, func(f wireField) (ok bool, err error) {
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			m.ClientId, err = f.str()
		case f.num == 2 && f.typ == protowire.BytesType:
			err = decodeResource(f.b, m)
		case f.num == 3 && f.typ == protowire.VarintType:
			m.Incarnation = int64(f.u)
		case f.num == 4 && f.typ == protowire.VarintType:
			m.Sequence = f.u
		default:
			return false, nil
		}
		return true, err
	})
}

// decodeResource decodes b, a ResourceRequest, and appends it to m's. The
// first takes one allocation with the slice of them.
func decodeResource(b []byte, m *capacityv1.GetCapacityRequest) error {
	var r *capacityv1.ResourceRequest
	if m.Resources == nil {
		one := new(struct {
			ptrs [1]*capacityv1.ResourceRequest
			r    capacityv1.ResourceRequest
		})
		r, m.Resources = &one.r, one.ptrs[:0]
	} else {
		r = new(capacityv1.ResourceRequest)
	}
	m.Resources = append(m.Resources, r)
	return decodeFields(b, r, func(f wireField) (ok bool, err error) {
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			r.ResourceId, err = f.str()
		case f.num == 2 && f.typ == protowire.Fixed64Type:
			r.Wants = math.Float64frombits(f.u)
		case f.num == 3 && f.typ == protowire.Fixed64Type:
			r.Has = math.Float64frombits(f.u)
		case f.num == 4 && f.typ == protowire.VarintType:
			r.Priority = int32(f.u)
		case f.num == 5 && f.typ == protowire.Fixed64Type:
			r.Weight = math.Float64frombits(f.u)
		case f.num == 6 && f.typ == protowire.BytesType:
			r.LeaseToken = append(make([]byte, 0, len(f.b)), f.b...)
		default:
			return false, nil
		}
		return true, err
	})
}

// The encoding of GetCapacity's answer, field by field in the order of
// their numbers, then the unknown fields, as proto.Marshal writes it:
// proto3 fields at their zero value are left out, a message field is
// written when not nil, and strings must be UTF-8.

// appendResponse appends the encoding of m to b.
func appendResponse(b []byte, m *capacityv1.GetCapacityResponse) ([]byte, error) {
	var body int
	var err error
	for _, g := range m.Grants {
		b, body = beginMessage(b, 1)
		if b, err = appendGrant(b, g); err != nil {
			return nil, err
		}
		b = endMessage(b, body)
	}
	b = appendBool(b, 2, m.Redirect)
	if b, err = appendString(b, 3, m.MasterAddress); err != nil {
		return nil, err
	}
	b = appendBool(b, 4, m.Stale)
	b = appendVarint(b, 5, uint64(m.Incarnation))
	return append(b, unknown(m)...), nil
}

// appendGrant appends the fields of g, nil for an empty message.
func appendGrant(b []byte, g *capacityv1.Grant) ([]byte, error) {
	if g == nil {
		return b, nil
	}
	b, err := appendString(b, 1, g.ResourceId)
	if err != nil {
		return nil, err
	}
	b = appendDouble(b, 2, g.Capacity)
	b = appendDuration(b, 3, g.Lease)
	b = appendDuration(b, 4, g.RefreshInterval)
	b = appendDouble(b, 5, g.SafeCapacity)
	b = appendVarint(b, 6, uint64(g.Code))
	if b, err = appendString(b, 7, g.Error); err != nil {
		return nil, err
	}
	b = appendBytes(b, 8, g.LeaseToken)
	return append(b, unknown(g)...), nil
}

// appendDuration appends field num, the Duration d, unless d is nil.
func appendDuration(b []byte, num protowire.Number, d *durationpb.Duration) []byte {
	if d == nil {
		return b
	}
	b, body := beginMessage(b, num)
	b = appendVarint(b, 1, uint64(d.Seconds))
	b = appendVarint(b, 2, uint64(d.Nanos))
	return endMessage(append(b, unknown(d)...), body)
}

// beginMessage appends the tag of field num, a message, and a byte for
// its length, and returns where its fields start: endMessage, once they
// are appended, writes their length.
func beginMessage(b []byte, num protowire.Number) (_ []byte, body int) {
	b = append(protowire.AppendTag(b, num, protowire.BytesType), 0)
	return b, len(b)
}

// endMessage writes the length of the fields from body, moving them when
// it takes more than the byte beginMessage left.
func endMessage(b []byte, body int) []byte {
	n := len(b) - body
	if n < 0x80 {
		b[body-1] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[body+k-1:], b[body:body+n])
	protowire.AppendVarint(b[:body-1], uint64(n))
	return b
}

// unknown returns the unknown fields of m.
func unknown(m protoreflect.ProtoMessage) []byte { return m.ProtoReflect().GetUnknown() }

// The fields of numbers 1 to 15 (a tag of one byte), left out at their
// zero value. A negative int32 or enum is written, as int64, in 10
// bytes: the callers convert it to int64 before uint64.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

// appendDouble writes -0, which is not the zero value.
func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	if math.Float64bits(v) == 0 {
		return b
	}
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), math.Float64bits(v))
}

func appendString(b []byte, num protowire.Number, v string) ([]byte, error) {
	if v == "" {
		return b, nil
	}
	if !utf8.ValidString(v) {
		return nil, errUTF8
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v), nil
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}
