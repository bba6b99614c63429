package capacity

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
)

// A subject's wire format: the gRPC method, a request encoder and a
// decoder of the capacity granted on the one resource asked for.
type wire struct {
	method  string
	request func(client, resource string, wants float64) []byte
	granted func(resp []byte) (float64, error)
}

var wires = map[string]wire{
	"doorman":   {"/doorman.Capacity/GetCapacity", doormanRequest, doormanGranted},
	"capacityd": {"/throttle.capacity.v1.CapacityService/GetCapacity", capacitydRequest, capacitydGranted},
}

// doormanRequest encodes Doorman's GetCapacityRequest: client_id (1) and
// one ResourceRequest (2) of resource_id (1), priority (2) and wants (4),
// all required in its proto2 schema.
func doormanRequest(client, resource string, wants float64) []byte {
	var rr []byte
	rr = protowire.AppendTag(rr, 1, protowire.BytesType)
	rr = protowire.AppendString(rr, resource)
	rr = protowire.AppendTag(rr, 2, protowire.VarintType)
	rr = protowire.AppendVarint(rr, 0)
	rr = protowire.AppendTag(rr, 4, protowire.Fixed64Type)
	rr = protowire.AppendFixed64(rr, math.Float64bits(wants))
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, client)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, rr)
}

// doormanGranted decodes GetCapacityResponse.response[0].gets.capacity
// (fields 1, 2 and 3).
func doormanGranted(b []byte) (float64, error) {
	rr, err := field(b, 1, protowire.BytesType)
	if err != nil {
		return 0, fmt.Errorf("response: %w", err)
	}
	lease, err := field(rr, 2, protowire.BytesType)
	if err != nil {
		return 0, fmt.Errorf("gets: %w", err)
	}
	c, err := field(lease, 3, protowire.Fixed64Type)
	if err != nil {
		return 0, fmt.Errorf("capacity: %w", err)
	}
	v, _ := protowire.ConsumeFixed64(c)
	return math.Float64frombits(v), nil
}

// field returns the encoded value of the first field num of type typ in
// message b: the bytes of a length-delimited field, the 8 bytes of a
// fixed64.
func field(b []byte, num protowire.Number, typ protowire.Type) ([]byte, error) {
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		b = b[l:]
		if n == num && t == typ {
			switch typ {
			case protowire.BytesType:
				v, l := protowire.ConsumeBytes(b)
				return v, protowire.ParseError(min(l, 0))
			case protowire.Fixed64Type:
				if len(b) < 8 {
					return nil, errors.New("truncated")
				}
				return b[:8], nil
			}
		}
		l = protowire.ConsumeFieldValue(n, t, b)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		b = b[l:]
	}
	return nil, fmt.Errorf("field %d missing", num)
}

func capacitydRequest(client, resource string, wants float64) []byte {
	b, err := proto.Marshal(&capacityv1.GetCapacityRequest{ClientId: client,
		Resources: []*capacityv1.ResourceRequest{{ResourceId: resource, Wants: wants}}})
	if err != nil {
		panic(err)
	}
	return b
}

func capacitydGranted(b []byte) (float64, error) {
	var m capacityv1.GetCapacityResponse
	if err := proto.Unmarshal(b, &m); err != nil {
		return 0, err
	}
	if len(m.GetGrants()) != 1 {
		return 0, fmt.Errorf("%d grants", len(m.GetGrants()))
	}
	return m.GetGrants()[0].GetCapacity(), nil
}

// rawCodec sends and receives messages encoded already: the load
// generator pays for no encoding beyond gRPC's framing.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }
