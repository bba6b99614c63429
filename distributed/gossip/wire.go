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
//	type     1 byte   msgReport, msgState, msgHello, msgAsk, msgAnswer or msgCharge
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
//	  ask, answer: see ownerwire.go
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
	// maxKeyLen is the longest key a gossip limiter accepts: one entry
	// must fit in a datagram next to the header and the MAC.
	maxKeyLen = 1024
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
	asks    []askEntry    // msgAsk
	answers []answerEntry // msgAnswer
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
// does not, and reports whether the entry starts a datagram.
func (e *encoder) room(n int) (first bool) {
	if e.buf == nil {
		e.start()
	}
	if len(e.buf)+n+macSize > MaxPacket || e.count == math.MaxUint16 {
		e.flush()
		e.start()
	}
	e.count++
	return e.count == 1
}

// addReport adds r and reports whether it starts a datagram.
func (e *encoder) addReport(r reportEntry) (first bool) {
	var tmp [3 * binary.MaxVarintLen64]byte
	nums := binary.AppendVarint(tmp[:0], r.born)
	nums = binary.AppendUvarint(nums, r.hits)
	nums = binary.AppendUvarint(nums, r.demand)
	first = e.room(uvarintLen(uint64(len(r.key))) + len(r.key) + len(nums))
	e.buf = binary.AppendUvarint(e.buf, uint64(len(r.key)))
	e.buf = append(e.buf, r.key...)
	e.buf = append(e.buf, nums...)
	return first
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
	rd := &reader{p: body[offSender:], maxKey: maxKey}
	count := m.decodeHeader(body, rd)
	m.decodeEntries(rd, count)
	if rd.bad || len(rd.p) != 0 {
		return nil, errMalformed
	}
	return m, nil
}

// decodeHeader reads the header of body, whose fields from the sender's
// ID on rd reads, and returns the number of entries that follow.
func (m *message) decodeHeader(body []byte, rd *reader) (count int) {
	m.typ = body[3]
	m.ack = binary.BigEndian.Uint64(body[offAck:])
	m.part = binary.BigEndian.Uint16(body[offPart:])
	m.parts = binary.BigEndian.Uint16(body[offParts:])
	m.seq = binary.BigEndian.Uint64(body[offSeq:])
	m.dstInc = binary.BigEndian.Uint64(body[offDst:])
	m.pround = binary.BigEndian.Uint64(body[offPRound:])
	m.prefix = binary.BigEndian.Uint16(body[offPrefix:])
	m.sender = rd.str()
	m.table = rd.str()
	m.incarnation = rd.u64()
	m.round = rd.u64()
	m.start = int64(rd.u64())
	count = int(rd.u16())
	rd.check(m.parts != 0 && m.part < m.parts && m.seq != 0 && m.sender != "" && m.incarnation != 0)
	return count
}

// decodeEntries reads the count entries of m's type: none for a hello,
// at least one for a report or a state.
func (m *message) decodeEntries(rd *reader, count int) {
	switch m.typ {
	case msgHello:
		rd.check(count == 0)
	case msgReport:
		rd.check(m.table != "" && count > 0)
		m.reports = make([]reportEntry, 0, count)
		for i := 0; i < count && !rd.bad; i++ {
			m.reports = append(m.reports, reportEntry{key: rd.key(), born: rd.varint(), hits: rd.count(), demand: rd.count()})
		}
	case msgState:
		rd.check(m.table != "" && count > 0)
		m.states = make([]stateEntry, 0, count)
		for i := 0; i < count && !rd.bad; i++ {
			s := stateEntry{key: rd.key(), tokens: rd.varint(), yours: rd.count(), born: rd.varint(), mine: rd.count()}
			rd.check(s.born >= 0)
			m.states = append(m.states, s)
		}
	case msgAsk, msgAnswer, msgCharge:
		m.decodeOwned(rd, count)
	default:
		rd.check(false)
	}
}

// reader reads the fields of a datagram in order. A field that runs past
// the end or is out of range makes it bad; a bad reader reads zero
// values and stays bad.
type reader struct {
	p      []byte
	maxKey int
	bad    bool
}

// check makes rd bad unless ok.
func (rd *reader) check(ok bool) {
	if !ok {
		rd.bad = true
	}
}

// take returns the next n bytes, or nil if there are not that many.
func (rd *reader) take(n int) []byte {
	if rd.bad || n < 0 || len(rd.p) < n {
		rd.bad = true
		return nil
	}
	b := rd.p[:n]
	rd.p = rd.p[n:]
	return b
}

// str reads a string of 1 byte of length and the bytes.
func (rd *reader) str() string {
	if b := rd.take(1); b != nil {
		return string(rd.take(int(b[0])))
	}
	return ""
}

func (rd *reader) u64() uint64 {
	if b := rd.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (rd *reader) u16() uint16 {
	if b := rd.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

// key reads a key: a uvarint length, from 1 to maxKey, and the bytes.
func (rd *reader) key() string {
	l := rd.uvarint()
	if rd.bad || l == 0 || l > uint64(rd.maxKey) {
		rd.bad = true
		return ""
	}
	return string(rd.take(int(l)))
}

func (rd *reader) varint() int64 { return readVarint(rd, binary.Varint) }

func (rd *reader) uvarint() uint64 { return readVarint(rd, binary.Uvarint) }

// readVarint reads a varint that parse (binary.Varint or binary.Uvarint)
// decodes.
func readVarint[T int64 | uint64](rd *reader, parse func([]byte) (T, int)) T {
	if rd.bad {
		return 0
	}
	v, n := parse(rd.p)
	rd.check(n > 0)
	rd.take(max(n, 0))
	return v
}

// count reads a uvarint counter, at most math.MaxInt64.
func (rd *reader) count() uint64 {
	v := rd.uvarint()
	rd.check(v <= math.MaxInt64)
	return v
}
