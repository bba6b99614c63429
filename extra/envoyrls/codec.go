package envoyrls

import (
	"errors"
	"math"
	"unicode/utf8"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// serverCodec encodes and decodes the messages of the gRPC server.
var serverCodec encoding.CodecV2 = rlsCodec{encoding.GetCodecV2(proto.Name)}

// rlsCodec is the gRPC server's codec: an RLS response of the fields the
// service sets is written field by field, without reflection
// (appendResponse), and a request of the usual shape is decoded by
// decodeRequest, its descriptors, entries and strings each in one
// allocation; every other message, and any request or response these do
// not take, goes to the proto codec. The bytes and messages are those of
// the proto codec. Its zero value is not usable (see serverCodec); safe
// for concurrent use.
type rlsCodec struct{ proto encoding.CodecV2 }

func (c rlsCodec) Name() string { return c.proto.Name() }

func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*rlsv3.RateLimitResponse)
	if !ok || !plainResponse(r) {
		return c.proto.Marshal(v)
	}
	size := responseSize(r)
	if mem.IsBelowBufferPoolingThreshold(size) { // pooling costs more than it saves
		return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, size), r))}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = appendResponse((*buf)[:0], r)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rlsv3.RateLimitRequest)
	if !ok || len(data) != 1 {
		return c.proto.Unmarshal(data, v)
	}
	if decodeRequest(data[0].ReadOnlyData(), r) {
		return nil
	}
	*r = rlsv3.RateLimitRequest{}
	return c.proto.Unmarshal(data, v)
}

// errShape is decodeRequest's signal for a request it leaves to the
// proto codec.
var errShape = errors.New("not the usual shape")

// decodeRequest decodes b into r, which must be empty, and reports
// whether it could: a request of a domain, a hits_addend and descriptors
// of entries (key, value), an optional limit override and hits_addend,
// each singular field at most once, the strings valid UTF-8, no other
// field. A first walk counts, a second fills one allocation of each kind.
// Any other request is left to the proto codec, which takes them all
// (and refuses the malformed ones).
func decodeRequest(b []byte, r *rlsv3.RateLimitRequest) bool {
	var shape requestArena
	if walkRequest(b, &shape) != nil {
		return false
	}
	a := &requestArena{fill: true, r: r, text: string(b)} // the strings are substrings of one copy
	if shape.nd > 0 {
		a.ds, a.dps = make([]rlv3.RateLimitDescriptor, shape.nd), make([]*rlv3.RateLimitDescriptor, shape.nd)
		r.Descriptors = a.dps
	}
	a.es, a.eps = make([]rlv3.RateLimitDescriptor_Entry, shape.ne), make([]*rlv3.RateLimitDescriptor_Entry, shape.ne)
	a.limits = make([]rlv3.RateLimitDescriptor_RateLimitOverride, shape.nl)
	a.addends = make([]wrapperspb.UInt64Value, shape.na)
	return walkRequest(b, a) == nil
}

// requestArena is what decodeRequest's walks count (fill false) or fill:
// the request, its text, the allocations and how many of each are used.
type requestArena struct {
	fill    bool
	r       *rlsv3.RateLimitRequest
	text    string
	ds      []rlv3.RateLimitDescriptor
	dps     []*rlv3.RateLimitDescriptor
	es      []rlv3.RateLimitDescriptor_Entry
	eps     []*rlv3.RateLimitDescriptor_Entry
	limits  []rlv3.RateLimitDescriptor_RateLimitOverride
	addends []wrapperspb.UInt64Value
	nd, ne  int
	nl, na  int
}

// wireField is a field of a message: its number and wire type, and its
// value: a varint, or where a length-delimited one is in the request.
type wireField struct {
	num    protowire.Number
	typ    protowire.Type
	v      uint64
	off, n int
}

// fields calls f for each field of the message at b[off:off+n] (offsets
// are within b, the whole request). A field numbered other than repeated
// seen twice, a number over 31, a wire type other than varint or bytes,
// or a malformed field is errShape.
func fields(b []byte, off, n int, repeated protowire.Number, f func(wireField) error) error {
	var seen uint32
	for i, end := off, off+n; i < end; {
		num, typ, l := protowire.ConsumeTag(b[i:end])
		if l < 0 || num > 31 || (num != repeated && seen&(1<<num) != 0) {
			return errShape
		}
		seen |= 1 << num
		i += l
		fd := wireField{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			fd.v, l = protowire.ConsumeVarint(b[i:end])
		case protowire.BytesType:
			var s []byte
			s, l = protowire.ConsumeBytes(b[i:end])
			fd.off, fd.n = i+l-len(s), len(s)
		default:
			return errShape
		}
		if l < 0 {
			return errShape
		}
		i += l
		if err := f(fd); err != nil {
			return err
		}
	}
	return nil
}

// text is the string of the field f, valid UTF-8 as proto3 wants.
func (a *requestArena) str(b []byte, f wireField) (string, error) {
	if !utf8.Valid(b[f.off : f.off+f.n]) {
		return "", errShape
	}
	if !a.fill {
		return "", nil
	}
	return a.text[f.off : f.off+f.n], nil
}

// walkRequest walks the request b, counting or filling a.
func walkRequest(b []byte, a *requestArena) error {
	return fields(b, 0, len(b), 2, func(f wireField) error {
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			s, err := a.str(b, f)
			if a.fill {
				a.r.Domain = s
			}
			return err
		case f.num == 2 && f.typ == protowire.BytesType:
			return a.descriptor(b, f)
		case f.num == 3 && f.typ == protowire.VarintType && f.v <= math.MaxUint32:
			if a.fill {
				a.r.HitsAddend = uint32(f.v)
			}
			return nil
		}
		return errShape
	})
}

// take counts one more of a kind of message in *n and, when a fills,
// returns the next one of s (nil when it counts).
func take[T any](a *requestArena, s []T, n *int) *T {
	*n++
	if !a.fill {
		return nil
	}
	return &s[*n-1]
}

// descriptor walks the descriptor in f.
func (a *requestArena) descriptor(b []byte, f wireField) error {
	d := take(a, a.ds, &a.nd)
	if a.fill {
		a.dps[a.nd-1] = d
	}
	first := a.ne
	err := fields(b, f.off, f.n, 1, func(f wireField) error {
		if f.typ != protowire.BytesType {
			return errShape
		}
		switch f.num {
		case 1:
			return a.entry(b, f)
		case 2:
			return a.override(b, f, d)
		case 3:
			return a.addend(b, f, d)
		}
		return errShape
	})
	if a.fill && a.ne > first {
		d.Entries = a.eps[first:a.ne:a.ne]
	}
	return err
}

// entry walks the entry in f: a key and a value.
func (a *requestArena) entry(b []byte, f wireField) error {
	e := take(a, a.es, &a.ne)
	if a.fill {
		a.eps[a.ne-1] = e
	}
	return fields(b, f.off, f.n, 0, func(f wireField) error {
		if f.typ != protowire.BytesType || (f.num != 1 && f.num != 2) {
			return errShape
		}
		s, err := a.str(b, f)
		if a.fill && f.num == 1 {
			e.Key = s
		} else if a.fill {
			e.Value = s
		}
		return err
	})
}

// override walks the limit override in f into d.
func (a *requestArena) override(b []byte, f wireField, d *rlv3.RateLimitDescriptor) error {
	o := take(a, a.limits, &a.nl)
	if a.fill {
		d.Limit = o
	}
	return fields(b, f.off, f.n, 0, func(f wireField) error {
		switch {
		case f.typ != protowire.VarintType:
			return errShape
		case f.num == 1 && f.v <= math.MaxUint32:
			if a.fill {
				o.RequestsPerUnit = uint32(f.v)
			}
		case f.num == 2 && f.v <= math.MaxInt32:
			if a.fill {
				o.Unit = typev3.RateLimitUnit(f.v)
			}
		default:
			return errShape
		}
		return nil
	})
}

// addend walks the hits_addend wrapper in f into d.
func (a *requestArena) addend(b []byte, f wireField, d *rlv3.RateLimitDescriptor) error {
	w := take(a, a.addends, &a.na)
	if a.fill {
		d.HitsAddend = w
	}
	return fields(b, f.off, f.n, 0, func(f wireField) error {
		if f.num != 1 || f.typ != protowire.VarintType {
			return errShape
		}
		if a.fill {
			w.Value = f.v
		}
		return nil
	})
}
