package slidinglog

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// maxWindow is the longest window a sliding log accepts (about 146 years):
// an entry packs a nanosecond offset of at most bits.Len(window)+1 bits
// and a count into 64 bits.
const maxWindow = time.Duration(1<<62 - 1)

// params are the immutable parameters shared by every log of a limiter.
type params struct {
	limit    int64
	window   int64  // ns
	cbits    uint   // low bits of an entry holding its count
	maxCount uint64 // 1<<cbits - 1: the largest count one entry holds
	maxOff   int64  // the largest offset an entry holds
	floor    int64  // math.MinInt64 + window: the earliest time a log records
}

// after returns t + window, or math.MaxInt64 if that is past the end of
// int64 time: the instant an entry at t leaves the window.
func (p *params) after(t int64) int64 {
	if t > math.MaxInt64-p.window {
		return math.MaxInt64
	}
	return t + p.window
}

func newParams(limit int, window time.Duration) (params, error) {
	switch {
	case limit <= 0:
		return params{}, fmt.Errorf("%w: slidinglog: limit must be positive, got %d", throttle.ErrInvalid, limit)
	case window <= 0:
		return params{}, fmt.Errorf("%w: slidinglog: window must be positive, got %v", throttle.ErrInvalid, window)
	case window > maxWindow:
		return params{}, fmt.Errorf("%w: slidinglog: window %v is above maxWindow", throttle.ErrInvalid, window)
	}
	// Offsets get one bit more than the window needs, so that after a
	// rebase (offsets < window) at least another window passes before the
	// next one: every entry is rebased at most once in its life.
	obits := uint(bits.Len64(uint64(window))) + 1 // <= 63
	cbits := 64 - obits                           // >= 1
	return params{
		limit:    int64(limit),
		window:   int64(window),
		cbits:    cbits,
		maxCount: 1<<cbits - 1,
		maxOff:   int64(1<<obits - 1),
		floor:    math.MinInt64 + int64(window),
	}, nil
}

// ring is the sliding log of one resource: the admissions of the last
// window, oldest first, each entry packed in a uint64 as
// offset<<cbits | count, where offset is the admission time in
// nanoseconds after base. Admissions at the same nanosecond share an
// entry (up to maxCount units), so a log holds at most limit entries and
// usually far fewer. An entry is never 0: it holds at least one unit.
//
// The entries are those of the buffer (a ring, the older ones) followed by
// those of tail (the newest). An admission writes its entry into tail,
// inside the ring itself; when tail is full its entries move to the buffer
// together. A log of up to len(tail) entries (most keys, most of the time)
// thus needs no buffer at all, and an admission to a busier log writes to
// its buffer, a cache line the decision would otherwise not touch, once in
// len(tail).
//
// The buffer is kept as a pointer and one word of counts rather than a
// slice and ints: that keeps a keyed log's state, with its lock and its
// published words, in 112 bytes, so that with its map slot it fills one
// aligned pair of cache lines. So the buffer holds at most maxBuf entries
// (1 GiB); a log that would need more denies until entries leave.
//
// The zero value is an empty log. A ring is not safe for concurrent use;
// its owner serializes access.
type ring struct {
	buf *uint64 // the buffer's first entry; nil until the log needs one
	// n packs the counts: the buffer's head (the index of its oldest
	// entry) and size (its entries), the entries in tail, and log2 of the
	// buffer's length (0: no buffer). See the accessors below.
	n     uint64
	total int64 // units in all the entries
	base  int64 // ns; an entry's time is base + offset
	// seen is the latest time the log was decided at, in ns, with its sign
	// bit flipped so that the zero value reads as the earliest time.
	seen int64
	tail [4]uint64 // the newest entries: tail[:tn]
}

// The layout of ring.n, low bits first: tn on 3 bits (the most used),
// head and size on idxBits each, log2 of the buffer's length on the rest.
const (
	idxBits   = 28
	idxMask   = 1<<idxBits - 1
	tnMask    = 7
	headShift = 3
	sizeShift = headShift + idxBits
	lenShift  = sizeShift + idxBits
)

// The buffer's length is a power of two, at least minBuf entries (one
// cache line) and at most maxBuf (so that its size fits idxBits). minBuf
// is above len(tail), so that a buffer that doubles always takes a full
// tail.
const (
	minBuf = 8
	maxBuf = 1 << (idxBits - 1)
)

// tn, head and size unpack ring.n.
func (r *ring) tn() int   { return int(r.n & tnMask) }
func (r *ring) head() int { return int(r.n >> headShift & idxMask) }
func (r *ring) size() int { return int(r.n >> sizeShift & idxMask) }

// bufLen returns the buffer's length, 0 if there is none.
func (r *ring) bufLen() int {
	if lg := r.n >> lenShift; lg != 0 {
		return 1 << lg
	}
	return 0
}

// setTn sets the entries in tail.
func (r *ring) setTn(n int) { r.n = r.n&^tnMask | uint64(n) }

// setBuffered sets the buffer's head and size.
func (r *ring) setBuffered(head, size int) {
	r.n = r.n&^(idxMask<<headShift|idxMask<<sizeShift) | uint64(head)<<headShift | uint64(size)<<sizeShift
}

// clearCounts empties the log's entries, keeping its buffer.
func (r *ring) clearCounts() {
	r.n &^= 1<<lenShift - 1
	r.total = 0
}

// buffer returns the buffer as a slice; there is one.
func (r *ring) buffer() []uint64 { return unsafe.Slice(r.buf, 1<<(r.n>>lenShift)) }

// entries returns the number of entries in the log.
func (r *ring) entries() int { return r.size() + r.tn() }

// at returns the i-th oldest entry, i < r.entries().
func (r *ring) at(i int) uint64 {
	size := r.size()
	if i >= size {
		return r.tail[i-size]
	}
	buf := r.buffer()
	return buf[(r.head()+i)&(len(buf)-1)]
}

// oldest returns the time of the oldest entry; r.total > 0.
func (r *ring) oldest(p *params) int64 { return r.base + int64(r.at(0)>>p.cbits) }

// newest returns the time of the newest entry; r.total > 0. That entry is
// in tail: a push leaves one there, and expire never drops the newest.
func (r *ring) newest(p *params) int64 { return r.base + int64(r.tail[r.tn()-1]>>p.cbits) }

// expire drops the entries that are out of the window at now: those at or
// before now-window.
func (r *ring) expire(p *params, now int64) {
	cutoff := now - p.window
	if r.total == 0 || r.newest(p) <= cutoff { // fast paths: empty, or all expired
		r.clearCounts()
		return
	}
	if cutoff < r.base {
		return // every entry is at base or later
	}
	// An entry expires if its offset is at most cutoff-base, that is if
	// the packed entry is below lim. The newest entry does not expire, so
	// the loops stop before the log is empty: tail keeps at least it.
	lim := uint64(cutoff-r.base+1) << p.cbits
	if size := r.size(); size > 0 {
		buf, head := r.buffer(), r.head()
		mask := len(buf) - 1
		for ; size > 0 && buf[head] < lim; size-- {
			r.total -= int64(buf[head] & p.maxCount)
			head = (head + 1) & mask
		}
		r.setBuffered(head, size)
		if size > 0 {
			return
		}
	}
	k := 0
	for ; r.tail[k] < lim; k++ {
		r.total -= int64(r.tail[k] & p.maxCount)
	}
	if k > 0 {
		r.setTn(copy(r.tail[:], r.tail[k:r.tn()]))
	}
}

// decide admits n units at now if the window ending at now holds room for
// them. The caller has checked 0 < n <= limit.
//
// If the clock steps back, the log takes time as standing still at the
// latest time it has seen: entries expired stay expired and admissions
// are recorded at that time, so the log stays ordered and its bound holds
// on the times it records. Likewise time stands still at p.floor during
// the first window of int64 time (1677), so that now - window never
// wraps. Durations are from now, the caller's time.
func (r *ring) decide(p *params, now int64, n int64) (ok bool, remaining, retryAfter, resetAfter int64) {
	at := max(r.seen^math.MinInt64, now, p.floor)
	r.seen = at ^ math.MinInt64
	r.expire(p, at)
	if r.total+n <= p.limit && r.room(p, n) {
		r.push(p, at, n)
		return true, p.limit - r.total, 0, at + p.window - now
	}
	// Denied: the request fits once the oldest total+n-limit units expire
	// (at least the oldest entry, when the buffer is what lacks room).
	// Each entry holds at least one unit, so this walks at most n entries
	// (one when the log is full and n = 1).
	need := max(r.total+n-p.limit, 1)
	var e uint64
	for i := 0; need > 0; i++ {
		e = r.at(i)
		need -= int64(e & p.maxCount)
	}
	return false, p.limit - r.total, r.base + int64(e>>p.cbits) + p.window - now, r.newest(p) + p.window - now
}

// room reports whether the buffer can take the entries an admission of n
// units may add. Only a log of a hundred million entries lacks it.
func (r *ring) room(p *params, n int64) bool {
	size := r.size()
	if size < maxBuf/2 {
		return true
	}
	return uint64(size)+uint64(len(r.tail))+(uint64(n)+p.maxCount-1)/p.maxCount <= maxBuf
}

// fill writes into *d the Decision of what decide returned (in place: see
// limiterkit.Fill).
func (p *params) fill(d *throttle.Decision, ok bool, remaining, retryAfter, resetAfter int64) {
	limiterkit.Fill(d, ok, p.limit, remaining, retryAfter, resetAfter)
}

// push appends n units admitted at now, no earlier than the newest entry.
func (r *ring) push(p *params, now int64, n int64) {
	empty := r.total == 0
	r.total += n
	tn := r.tn()
	if empty {
		r.base = now
	} else if last := r.newest(p); tn < len(r.tail) && now != last && now-r.base <= p.maxOff && uint64(n) <= p.maxCount {
		// The common case: one more entry, room for it in tail, no rebase.
		r.tail[tn] = uint64(now-r.base)<<p.cbits | uint64(n)
		r.n++ // tn
		return
	} else if now-r.base > p.maxOff {
		r.rebase(p)
	} else if now == last {
		// Same nanosecond as the newest entry: add to its count.
		if c := r.tail[tn-1] & p.maxCount; c+uint64(n) <= p.maxCount {
			r.tail[tn-1] += uint64(n)
			return
		}
	}
	off := uint64(now-r.base) << p.cbits
	for n > 0 {
		c := min(uint64(n), p.maxCount)
		if r.tn() == len(r.tail) {
			r.flush()
		}
		r.tail[r.tn()] = off | c
		r.n++ // tn
		n -= int64(c)
	}
}

// flush moves the entries of tail to the end of the buffer, growing it if
// it lacks room for them.
func (r *ring) flush() {
	size, tn := r.size(), r.tn()
	if size+tn > r.bufLen() {
		r.grow()
	}
	buf := r.buffer()
	mask := len(buf) - 1
	j := r.head() + size
	for _, e := range r.tail[:tn] {
		buf[j&mask] = e
		j++
	}
	r.n = r.n&^(idxMask<<sizeShift|tnMask) | uint64(size+tn)<<sizeShift
}

// rebase moves base to the oldest entry, so offsets are below window. The
// caller has expired the log: the oldest entry is less than a window old.
// A rebase happens at most once per window and touches live entries only,
// so it costs O(1) per admission, amortized.
func (r *ring) rebase(p *params) {
	shift := r.at(0) >> p.cbits << p.cbits
	if size := r.size(); size > 0 {
		buf, head := r.buffer(), r.head()
		for i := range size {
			buf[(head+i)&(len(buf)-1)] -= shift
		}
	}
	for i := range r.tn() {
		r.tail[i] -= shift
	}
	r.base += int64(shift >> p.cbits)
}

// grow gives the buffer room for its entries and tail's: minBuf entries,
// then twice as many each time (room has checked that maxBuf suffices).
func (r *ring) grow() {
	n := max(2*r.bufLen(), minBuf)
	buf := make([]uint64, n)
	size := r.size()
	for i := range size {
		buf[i] = r.at(i)
	}
	r.buf = &buf[0]
	r.n = r.n&tnMask | uint64(bits.TrailingZeros(uint(n)))<<lenShift | uint64(size)<<sizeShift
}

// log is a ring behind a mutex, which also publishes, for lock-free
// readers, when the ring is full: while it is, every request is denied,
// and a denial of one unit needs nothing but the time the oldest entry
// expires and the time the newest does. Under a flood of requests, that
// is nearly every call, so the denial path takes no lock and writes
// nothing shared.
//
// The zero value is an empty log.
type log struct {
	// seq, full and reset form a seqlock written under mu: seq is odd
	// while full and reset change. They come first: a lock-free denial
	// reads these three words only.
	seq   atomic.Uint64
	full  atomic.Int64 // ns; the ring is full before this time (0: not full)
	reset atomic.Int64 // ns; the newest entry expires at this time, if any
	mu    sync.Mutex
	ring
}

// denyFast reports whether the published state answers a request for n
// units at now without the lock: the ring full at now and n = 1. If so
// the request is denied, with these durations.
func (l *log) denyFast(now int64, n int) (retryAfter, resetAfter int64, ok bool) {
	s := l.seq.Load()
	full := l.full.Load()
	if n != 1 || now >= full || full == 0 || s&1 != 0 {
		return 0, 0, false
	}
	reset := l.reset.Load()
	if l.seq.Load() != s {
		return 0, 0, false
	}
	return full - now, reset - now, true
}

// decide is ring.decide, publishing the new state; l.mu is held.
func (l *log) decide(p *params, now int64, n int64) (ok bool, remaining, retryAfter, resetAfter int64) {
	ok, remaining, retryAfter, resetAfter = l.ring.decide(p, now, n)
	full := int64(0)
	if l.total == p.limit {
		full = p.after(l.oldest(p))
	}
	// Publish when fullness changes. The log is not empty here: an
	// admission adds units, and a denial needs total + n > limit.
	if full != l.full.Load() {
		l.seq.Add(1)
		l.full.Store(full)
		l.reset.Store(p.after(l.newest(p)))
		l.seq.Add(1)
	}
	return
}

// kill empties the log and leaves it dead, giving its buffer back (or to
// the log it moved to); l.mu is held. A dead log's seq stays odd, so that
// lock-free readers never trust it, and l.dead reports it to writers.
func (l *log) kill() {
	l.seq.Add(1)
	l.full.Store(0)
	l.ring = ring{}
}

// dead reports whether the log was killed; l.mu is held (seq is odd
// otherwise only while its holder publishes).
func (l *log) dead() bool { return l.seq.Load()&1 != 0 }
