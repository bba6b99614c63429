package envoyrls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The response's encoder, for the fields the service sets: the bytes
// proto.Marshal writes (fields in the order of their numbers, defaults
// left out), without reflection.

// plainResponse reports whether r sets only what appendResponse encodes.
func plainResponse(r *rlsv3.RateLimitResponse) bool {
	if r.RequestHeadersToAdd != nil || r.RawBody != nil || r.DynamicMetadata != nil || r.Quota != nil {
		return false
	}
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil {
			return false
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		if h == nil || h.RawValue != nil {
			return false
		}
	}
	return true
}

// sizeTagged is the size of a field whose value takes n bytes, with a
// one-byte tag; of a length-delimited one when delimited.
func sizeTagged(n int, delimited bool) int {
	if delimited {
		n += protowire.SizeVarint(uint64(n))
	}
	return 1 + n
}

// sizeInt is the size of a varint field of value v (0 when v is 0: left
// out).
func sizeInt(v int64) int {
	if v == 0 {
		return 0
	}
	return sizeTagged(protowire.SizeVarint(uint64(v)), false)
}

func sizeString(s string) int {
	if s == "" {
		return 0
	}
	return sizeTagged(len(s), true)
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// appendHeader appends the tag and length of an embedded message of n
// bytes.
func appendHeader(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return sizeInt(int64(l.RequestsPerUnit)) + sizeInt(int64(l.Unit)) + sizeString(l.Name)
}

func durationSize(d *durationpb.Duration) int { return sizeInt(d.Seconds) + sizeInt(int64(d.Nanos)) }

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeInt(int64(st.Code)) + sizeInt(int64(st.LimitRemaining))
	if st.CurrentLimit != nil {
		n += sizeTagged(limitSize(st.CurrentLimit), true)
	}
	if st.DurationUntilReset != nil {
		n += sizeTagged(durationSize(st.DurationUntilReset), true)
	}
	return n
}

// responseSize is the size of r encoded (see plainResponse).
func responseSize(r *rlsv3.RateLimitResponse) int {
	n := sizeInt(int64(r.OverallCode))
	for _, st := range r.Statuses {
		n += sizeTagged(statusSize(st), true)
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += sizeTagged(sizeString(h.Key)+sizeString(h.Value), true)
	}
	return n
}

// appendResponse appends r encoded (see plainResponse).
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	b = appendInt(b, 1, int64(r.OverallCode))
	for _, st := range r.Statuses {
		b = appendHeader(b, 2, statusSize(st))
		b = appendInt(b, 1, int64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = appendHeader(b, 2, limitSize(l))
			b = appendInt(b, 1, int64(l.RequestsPerUnit))
			b = appendInt(b, 2, int64(l.Unit))
			b = appendString(b, 3, l.Name)
		}
		b = appendInt(b, 3, int64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = appendHeader(b, 4, durationSize(d))
			b = appendInt(b, 1, d.Seconds)
			b = appendInt(b, 2, int64(d.Nanos))
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = appendHeader(b, 3, sizeString(h.Key)+sizeString(h.Value))
		b = appendString(b, 1, h.Key)
		b = appendString(b, 2, h.Value)
	}
	return b
}
