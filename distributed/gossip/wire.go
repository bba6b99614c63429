package gossip

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"math"
)

// Wire format, version 2. Every datagram is one message:
//
//	magic    2 bytes  "TG"
//	version  1 byte   2
//	type     1 byte   msgReport, msgState or msgHello
//	ack      8 bytes  big endian     the receiver's latest round of which
//	                                 the sender got every datagram
//	part     2 bytes  big endian     index of this datagram in its round
//	parts    2 bytes  big endian     datagrams the sender sent the
//	                                 receiver this round
//	seq      8 bytes  big endian     sequence number of the datagram from
//	                                 this sender incarnation to this
//	                                 receiver, from 1, increasing (copies
//	                                 of a datagram share it)
//	dstinc   8 bytes  big endian     the receiver's incarnation as the
//	                                 sender knows it, 0 if unknown
//	pround   8 bytes  big endian     the receiver's latest round of which
//	                                 the sender got datagrams, and
//	prefix   2 bytes  big endian     how many of them, from part 0, it got
//	                                 without a gap
//	sender   1 byte length + bytes   the sender's node ID
//	table    1 byte length + bytes   the limiter name ("" for hello)
//	incarn   8 bytes  big endian     sender's incarnation (not 0; grows
//	                                 from one life to the next)
//	round    8 bytes  big endian     sender's round number
//	start    8 bytes  big endian     sender's start time (ns, its clock)
//	count    2 bytes  big endian     number of entries
//	entries  count times:
//	  report: uvarint key length, key, varint born (ns), uvarint hits, uvarint demand
//	  state:  uvarint key length, key, varint tokens, uvarint yours
//	mac      32 bytes HMAC-SHA256(secret, receiver ID (1 byte length +
//	                  bytes) followed by everything before the mac)
//
// Report entries carry cumulative counters per (sender incarnation, key):
// a receiver applies the difference from the highest value it has seen, so
// lost, duplicated and reordered datagrams neither lose nor double-count
// hits. ack, part and parts let the sender learn which rounds a peer
// received in full, and resend everything that changed since; pround and
// prefix acknowledge the leading datagrams of a round received only in
// part (a sender puts its reports in a fixed order, so those carried the
// counters before a position in that order).
//
// Replay protection: the MAC covers the receiver's ID, so a datagram
// replayed to another node fails authentication; reports and states must
// name the receiver's current incarnation (dstinc), so those captured
// before it restarted are refused; and a receiver keeps, per peer
// incarnation, a window of the sequence numbers it accepted, so a datagram
// replayed to the same receiver later is refused as a duplicate or as too
// old. Incarnations are ordered: a receiver refuses a sender incarnation
// older than the one it knows, and a datagram naming an older incarnation
// of itself, so a peer's older lives cannot come back.
const (
	wireVersion = 2
	macSize     = sha256.Size
	// MaxPacket is the largest datagram the gossip protocol sends, chosen
	// to fit an Ethernet MTU with IP and UDP headers.
	MaxPacket = 1400
	// MaxKeyLen is the longest key a gossip limiter accepts: one entry
	// must fit in a datagram next to the header and the MAC.
	MaxKeyLen = 1024
	// maxName bounds node IDs and limiter names on the wire.
	maxName = 255
	// offsets of the per-receiver fields, patched by seal.
	offAck, offPart, offParts, offSeq, offDst, offPRound, offPrefix, offSender = 4, 12, 14, 16, 24, 32, 40, 42
)

const (
	msgReport = 1
	msgState  = 2
	msgHello  = 3
)

var (
	errMalformed = errors.New("gossip: malformed message")
	errMAC       = errors.New("gossip: bad message authentication code")
)

type header struct {
	typ         byte
	ack         uint64
	part, parts uint16
	seq         uint64
	dstInc      uint64
	pround      uint64
	prefix      uint16
	sender      string
	table       string
	incarnation uint64
	round       uint64
	start       int64
}

type reportEntry struct {
	key    string
	born   int64
	hits   uint64
	demand uint64
}

type stateEntry struct {
	key    string
	tokens int64  // the sender's bucket level
	yours  uint64 // hits of the receiver's current counter that level includes
	born   int64  // the sender's own counter for the key (0: none)...
	mine   uint64 // ...and at least the hits of it that level includes
}

// message is a decoded datagram. Keys alias a copy of the datagram.
type message struct {
	header
	reports []reportEntry
	states  []stateEntry
}

// signer computes MACs with a shared secret. It is not safe for concurrent
// use.
type signer struct{ h hash.Hash }

func newSigner(secret []byte) *signer { return &signer{h: hmac.New(sha256.New, secret)} }

// sum appends to dst the MAC of data sent to the node with ID to.
func (s *signer) sum(dst []byte, to string, data []byte) []byte {
	s.h.Reset()
	s.h.Write([]byte{byte(len(to))})
	s.h.Write([]byte(to))
	s.h.Write(data)
	return s.h.Sum(dst)
}

// encoder builds the bodies of datagrams of one header, splitting entries
// over as many as needed so that each, sealed, is at most MaxPacket bytes.
// seal adds the per-receiver fields and the MAC.
type encoder struct {
	hdr     header
	buf     []byte
	count   int
	countAt int
	out     [][]byte
	counts  []int // entries of each body in out
}

func (e *encoder) start() {
	e.buf = make([]byte, 0, MaxPacket)
	e.buf = append(e.buf, 'T', 'G', wireVersion, e.hdr.typ)
	e.buf = append(e.buf, make([]byte, offSender-offAck)...) // the per-receiver fields
	e.buf = append(e.buf, byte(len(e.hdr.sender)))
	e.buf = append(e.buf, e.hdr.sender...)
	e.buf = append(e.buf, byte(len(e.hdr.table)))
	e.buf = append(e.buf, e.hdr.table...)
	e.buf = binary.BigEndian.AppendUint64(e.buf, e.hdr.incarnation)
	e.buf = binary.BigEndian.AppendUint64(e.buf, e.hdr.round)
	e.buf = binary.BigEndian.AppendUint64(e.buf, uint64(e.hdr.start))
	e.countAt = len(e.buf)
	e.buf = append(e.buf, 0, 0)
	e.count = 0
}

// room makes sure an entry of size n fits, starting a new datagram if it
// does not.
func (e *encoder) room(n int) {
	if e.buf == nil {
		e.start()
	}
	if len(e.buf)+n+macSize > MaxPacket || e.count == math.MaxUint16 {
		e.flush()
		e.start()
	}
	e.count++
}

func (e *encoder) addReport(r reportEntry) {
	var tmp [3 * binary.MaxVarintLen64]byte
	nums := binary.AppendVarint(tmp[:0], r.born)
	nums = binary.AppendUvarint(nums, r.hits)
	nums = binary.AppendUvarint(nums, r.demand)
	e.room(uvarintLen(uint64(len(r.key))) + len(r.key) + len(nums))
	e.buf = binary.AppendUvarint(e.buf, uint64(len(r.key)))
	e.buf = append(e.buf, r.key...)
	e.buf = append(e.buf, nums...)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func (e *encoder) addState(s stateEntry) {
	var tmp [4 * binary.MaxVarintLen64]byte
	t := binary.AppendVarint(tmp[:0], s.tokens)
	t = binary.AppendUvarint(t, s.yours)
	t = binary.AppendVarint(t, s.born)
	t = binary.AppendUvarint(t, s.mine)
	e.room(uvarintLen(uint64(len(s.key))) + len(s.key) + len(t))
	e.buf = binary.AppendUvarint(e.buf, uint64(len(s.key)))
	e.buf = append(e.buf, s.key...)
	e.buf = append(e.buf, t...)
}

// flush ends the current body, if it has entries or is a hello.
func (e *encoder) flush() {
	if e.buf == nil || (e.count == 0 && e.hdr.typ != msgHello) {
		return
	}
	binary.BigEndian.PutUint16(e.buf[e.countAt:], uint16(e.count))
	e.out = append(e.out, e.buf)
	e.counts = append(e.counts, e.count)
	e.buf = nil
}

// finish returns the bodies (unsealed).
func (e *encoder) finish() [][]byte {
	if e.buf == nil && e.hdr.typ == msgHello {
		e.start()
	}
	e.flush()
	out := e.out
	e.out = nil
	return out
}

// seal returns a copy of body with the per-receiver fields set and the
// MAC for receiver to appended.
func (s *signer) seal(body []byte, to string, h header) []byte {
	p := make([]byte, len(body), len(body)+macSize)
	copy(p, body)
	binary.BigEndian.PutUint64(p[offAck:], h.ack)
	binary.BigEndian.PutUint16(p[offPart:], h.part)
	binary.BigEndian.PutUint16(p[offParts:], h.parts)
	binary.BigEndian.PutUint64(p[offSeq:], h.seq)
	binary.BigEndian.PutUint64(p[offDst:], h.dstInc)
	binary.BigEndian.PutUint64(p[offPRound:], h.pround)
	binary.BigEndian.PutUint16(p[offPrefix:], h.prefix)
	return s.sum(p, to, p)
}

// decode authenticates a datagram sent to the node with ID self and
// parses it. It never panics and rejects anything that is not exactly a
// well-formed message.
func decode(sig *signer, pkt []byte, maxKey int, self string) (*message, error) {
	if len(pkt) > MaxPacket || len(pkt) < offSender+2+24+2+macSize {
		return nil, errMalformed
	}
	body, mac := pkt[:len(pkt)-macSize], pkt[len(pkt)-macSize:]
	var sum [macSize]byte
	if !hmac.Equal(sig.sum(sum[:0], self, body), mac) {
		return nil, errMAC
	}
	if body[0] != 'T' || body[1] != 'G' || body[2] != wireVersion {
		return nil, errMalformed
	}
	body = append([]byte(nil), body...) // keys alias this private copy
	m := &message{}
	m.typ = body[3]
	m.ack = binary.BigEndian.Uint64(body[offAck:])
	m.part = binary.BigEndian.Uint16(body[offPart:])
	m.parts = binary.BigEndian.Uint16(body[offParts:])
	m.seq = binary.BigEndian.Uint64(body[offSeq:])
	m.dstInc = binary.BigEndian.Uint64(body[offDst:])
	m.pround = binary.BigEndian.Uint64(body[offPRound:])
	m.prefix = binary.BigEndian.Uint16(body[offPrefix:])
	if m.parts == 0 || m.part >= m.parts || m.seq == 0 {
		return nil, errMalformed
	}
	p := body[offSender:]
	str := func() (string, bool) {
		if len(p) < 1 || len(p) < 1+int(p[0]) {
			return "", false
		}
		s := string(p[1 : 1+int(p[0])])
		p = p[1+int(p[0]):]
		return s, true
	}
	var ok bool
	if m.sender, ok = str(); !ok || m.sender == "" {
		return nil, errMalformed
	}
	if m.table, ok = str(); !ok {
		return nil, errMalformed
	}
	if len(p) < 26 {
		return nil, errMalformed
	}
	m.incarnation = binary.BigEndian.Uint64(p)
	m.round = binary.BigEndian.Uint64(p[8:])
	m.start = int64(binary.BigEndian.Uint64(p[16:]))
	count := int(binary.BigEndian.Uint16(p[24:]))
	p = p[26:]
	if m.incarnation == 0 {
		return nil, errMalformed
	}
	key := func() (string, bool) {
		l, n := binary.Uvarint(p)
		if n <= 0 || l == 0 || l > uint64(maxKey) || uint64(len(p)-n) < l {
			return "", false
		}
		k := string(p[n : n+int(l)])
		p = p[n+int(l):]
		return k, true
	}
	switch m.typ {
	case msgHello:
		if count != 0 {
			return nil, errMalformed
		}
	case msgReport:
		if m.table == "" || count == 0 {
			return nil, errMalformed
		}
		m.reports = make([]reportEntry, 0, count)
		for range count {
			var r reportEntry
			var n int
			if r.key, ok = key(); !ok {
				return nil, errMalformed
			}
			if r.born, n = binary.Varint(p); n <= 0 {
				return nil, errMalformed
			}
			p = p[n:]
			if r.hits, n = binary.Uvarint(p); n <= 0 || r.hits > math.MaxInt64 {
				return nil, errMalformed
			}
			p = p[n:]
			if r.demand, n = binary.Uvarint(p); n <= 0 || r.demand > math.MaxInt64 {
				return nil, errMalformed
			}
			p = p[n:]
			m.reports = append(m.reports, r)
		}
	case msgState:
		if m.table == "" || count == 0 {
			return nil, errMalformed
		}
		m.states = make([]stateEntry, 0, count)
		for range count {
			var s stateEntry
			var n int
			if s.key, ok = key(); !ok {
				return nil, errMalformed
			}
			if s.tokens, n = binary.Varint(p); n <= 0 {
				return nil, errMalformed
			}
			p = p[n:]
			if s.yours, n = binary.Uvarint(p); n <= 0 || s.yours > math.MaxInt64 {
				return nil, errMalformed
			}
			p = p[n:]
			if s.born, n = binary.Varint(p); n <= 0 || s.born < 0 {
				return nil, errMalformed
			}
			p = p[n:]
			if s.mine, n = binary.Uvarint(p); n <= 0 || s.mine > math.MaxInt64 {
				return nil, errMalformed
			}
			p = p[n:]
			m.states = append(m.states, s)
		}
	default:
		return nil, errMalformed
	}
	if len(p) != 0 {
		return nil, errMalformed
	}
	return m, nil
}
