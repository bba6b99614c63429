package gossip

import (
	"encoding/binary"
	"math"
)

// Messages of owner routing (see OwnedLimiter). They share the wire
// format of version 2 and its checks (MAC bound to the receiver, sender
// and receiver incarnations, sequence window), with part 0 of 1 parts and
// no round acknowledgement; unlike reports they must name the receiver's
// current incarnation (dstinc), so one captured before the receiver
// restarted is refused. Their table is the owned limiter's name.
//
//	ask:    uvarint id, uvarint key length, key, uvarint n
//	answer: uvarint id, 1 byte verdict, uvarint remaining, uvarint retry (ns), uvarint reset (ns)
//	charge: as an ask, id 0: n units admitted on a fallback bucket, for the owner to debit
const (
	msgAsk    = 4 // decisions forwarded to the keys' owner
	msgAnswer = 5 // the owner's decisions, matched to asks by id
	msgCharge = 6 // units admitted on fallback buckets, for the owner to debit: entries of an ask, id 0
)

// Verdicts of an answer entry.
const (
	verdictNo  = 0
	verdictOK  = 1
	verdictErr = 2 // the owner could not decide (n above its burst): the asker falls back
)

type askEntry struct {
	id  uint64
	key string
	n   uint64
}

type answerEntry struct {
	id           uint64
	verdict      byte
	remaining    uint64
	retry, reset uint64 // ns
}

// askSize is the encoded size of a.
func (a askEntry) size() int {
	return uvarintLen(a.id) + uvarintLen(uint64(len(a.key))) + len(a.key) + uvarintLen(a.n)
}

// maxAskSize is the largest encoded ask for a key of keyLen bytes: a
// 64-bit id and n up to MaxInt32.
func maxAskSize(keyLen int) int {
	return binary.MaxVarintLen64 + uvarintLen(uint64(keyLen)) + keyLen + uvarintLen(math.MaxInt32)
}

// ownedHeaderSize is the size of a sealed owner-routing datagram before
// its entries: header and MAC.
func ownedHeaderSize(sender, table string) int {
	return offSender + 1 + len(sender) + 1 + len(table) + 24 + 2 + macSize
}

func (e *encoder) addAsk(a askEntry) {
	e.room(a.size())
	e.buf = binary.AppendUvarint(e.buf, a.id)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(a.key)))
	e.buf = append(e.buf, a.key...)
	e.buf = binary.AppendUvarint(e.buf, a.n)
}

func (e *encoder) addAnswer(a answerEntry) {
	var tmp [4*binary.MaxVarintLen64 + 1]byte
	t := binary.AppendUvarint(tmp[:0], a.id)
	t = append(t, a.verdict)
	t = binary.AppendUvarint(t, a.remaining)
	t = binary.AppendUvarint(t, a.retry)
	t = binary.AppendUvarint(t, a.reset)
	e.room(len(t))
	e.buf = append(e.buf, t...)
}

// decodeOwned reads the count entries of an ask or an answer: at least
// one, each n in [1, MaxInt32], each verdict known.
func (m *message) decodeOwned(rd *reader, count int) {
	rd.check(m.table != "" && count > 0)
	if m.typ != msgAnswer {
		m.asks = make([]askEntry, 0, count)
	} else {
		m.answers = make([]answerEntry, 0, count)
	}
	for i := 0; i < count && !rd.bad; i++ {
		if m.typ != msgAnswer {
			a := askEntry{id: rd.uvarint(), key: rd.key(), n: rd.uvarint()}
			rd.check(a.n >= 1 && a.n <= 1<<31-1)
			m.asks = append(m.asks, a)
			continue
		}
		a := answerEntry{id: rd.uvarint()}
		if b := rd.take(1); b != nil {
			a.verdict = b[0]
		}
		a.remaining, a.retry, a.reset = rd.count(), rd.count(), rd.count()
		rd.check(a.verdict <= verdictErr && a.remaining <= 1<<31-1)
		m.answers = append(m.answers, a)
	}
}
