// Package window holds what the fixed-window and sliding-window limiters
// share: packing a window (or slot) index and one or two counts into one
// int64 that a single compare-and-swap updates, and exact integer helpers.
//
// A packed word is laid out, from the top bit down, as
//
//	[dead:1][tag: TagBits][hi count: CountBits][lo count: CountBits]
//
// (one-count layouts have no hi field). CountBits is the bit length of the
// limit, so small limits leave a wide tag. The tag is the index modulo
// 2^TagBits; Since recovers the signed distance from it to a given index,
// which is exact while the true distance is below 2^(TagBits-1) in
// magnitude. The dead bit is set only by a keyed map retiring the state.
package window

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Dead is the word of a state retired from a keyed map. No live word has
// its top bit set.
const Dead int64 = math.MinInt64

// MinTagBits is the narrowest tag NewLayout accepts.
const MinTagBits = 15

// Layout describes one packing. The zero Layout is not usable.
type Layout struct {
	cb    uint  // bits per count
	cmask int64 // 1<<cb - 1
	shift uint  // position of the tag: counts*cb
	tb    uint  // tag bits: 63 - shift
}

// NewLayout returns the packing of counts (1 or 2) counts of at most limit
// each, or false if the tag would be narrower than MinTagBits.
func NewLayout(limit int64, counts uint) (Layout, bool) {
	if limit <= 0 || counts < 1 || counts > 2 {
		return Layout{}, false
	}
	cb := uint(bits.Len64(uint64(limit)))
	shift := counts * cb
	if shift+MinTagBits > 63 {
		return Layout{}, false
	}
	return Layout{cb: cb, cmask: 1<<cb - 1, shift: shift, tb: 63 - shift}, true
}

// Max returns the largest count a word of l holds.
func (l Layout) Max() int64 { return l.cmask }

// TagBits returns the width of the tag.
func (l Layout) TagBits() uint { return l.tb }

// Pack1 returns the one-count word of tag (reduced modulo 2^TagBits) and c.
func (l Layout) Pack1(tag, c int64) int64 { return (tag<<l.shift)&^Dead | c }

// Pack2 returns the two-count word of tag (reduced modulo 2^TagBits), hi
// and lo.
func (l Layout) Pack2(tag, hi, lo int64) int64 { return (tag<<l.shift)&^Dead | hi<<l.cb | lo }

// Tag returns the tag of a live word, for Since.
func (l Layout) Tag(w int64) int64 { return w >> l.shift }

// Lo returns the low (or only) count of a live word.
func (l Layout) Lo(w int64) int64 { return w & l.cmask }

// Hi returns the high count of a live two-count word.
func (l Layout) Hi(w int64) int64 { return w >> l.cb & l.cmask }

// Since returns idx minus the tag of the live word w, as a signed number
// of TagBits bits: the distance from the index w was written at to idx,
// exact while that distance is within ±2^(TagBits-1).
func (l Layout) Since(w, idx int64) int64 {
	d := idx - w>>l.shift
	return d << (64 - l.tb) >> (64 - l.tb)
}

// Skew returns how many windows (or slots, or ticks) of length unit ns a
// stored index may lie ahead of a caller's index and still be taken as
// newer rather than stale: at least 2, at least one second's worth, and
// at most 2^(TagBits-3).
//
// Goroutines read the clock before their compare-and-swap, so a caller
// holding an older reading regularly finds the state already moved to a
// later window by a caller that read the clock after it. Counting its
// request in that later window is what keeps the bounds; restarting the
// window would over-admit. An index further ahead than Skew is taken as
// stale (a tag that wrapped around after a long idle period, or a clock
// stepped far back), so that a wrapped tag can never lock a state out for
// longer than Skew.
func (l Layout) Skew(unit int64) int64 {
	s := max(2, (int64(time.Second)+unit-1)/unit)
	return min(s, int64(1)<<(l.tb-3))
}

// Retire marks the state word w dead if it is zero or full(word, now) holds
// at a clock reading taken after loading it, or unconditionally when force
// is set, replacing exactly the word judged. It reports whether the word
// is now dead. It is the keyed.State.Retire of every window limiter.
func Retire(w *atomic.Int64, clk interface{ Now() int64 }, force bool, full func(w, now int64) bool) bool {
	for {
		old := w.Load()
		if old == Dead {
			return true
		}
		if !force && old != 0 && !full(old, clk.Now()) {
			return false
		}
		if w.CompareAndSwap(old, Dead) {
			return true
		}
	}
}

// Evict marks the state word w dead unconditionally and returns the word
// it replaced, 0 if it was already dead: the debt a window limiter's state
// leaves behind when a keyed map's cap evicts it (keyed.Debtor).
func Evict(w *atomic.Int64) int64 {
	if old := w.Swap(Dead); old != Dead {
		return old
	}
	return 0
}

// Move marks the state word w dead and copies it, with cfg, the
// configuration set before the word first left zero, into a fresh state
// (dw, dcfg) that nobody else sees yet: keyed.State.Move for the window
// limiters. The configuration is read after the word, so it is the one
// the copied word was written under.
func Move[C any](w *atomic.Int64, cfg *atomic.Pointer[C], dw *atomic.Int64, dcfg *atomic.Pointer[C]) {
	old := Evict(w)
	dcfg.Store(cfg.Load())
	dw.Store(old)
}

// FloorDiv returns a/b rounded toward minus infinity; b must be positive.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// FloorMod returns a modulo b in [0, b); b must be positive.
func FloorMod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}

// MulDiv returns floor(a·b/c) and whether the remainder is zero, computed
// exactly in 128 bits. a and b must be non-negative, c positive, and the
// quotient must fit in 64 bits (a·b < c·2^64, true whenever a < c or
// b <= c).
func MulDiv(a, b, c int64) (q int64, exact bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	uq, r := bits.Div64(hi, lo, uint64(c))
	return int64(uq), r == 0
}

// CeilMulDiv returns ceil(a·b/c) under the conditions of MulDiv.
func CeilMulDiv(a, b, c int64) int64 {
	q, exact := MulDiv(a, b, c)
	if !exact {
		q++
	}
	return q
}

// Divisor divides by a fixed positive int64 with two multiplications
// instead of a hardware division (which costs 40 to 90 cycles on common
// CPUs). The zero Divisor is not usable; make one with NewDivisor.
type Divisor struct {
	d uint64
	m uint64 // floor(2^64 / d); 0 when d == 1
}

// NewDivisor returns a Divisor by d, which must be positive.
func NewDivisor(d int64) Divisor {
	if d == 1 {
		return Divisor{d: 1}
	}
	m, _ := bits.Div64(1, 0, uint64(d))
	return Divisor{d: uint64(d), m: m}
}

// DivU returns a/d and a%d for any unsigned a.
//
// With m = floor(2^64/d), a·m/2^64 lies in (a/d - 1, a/d], so the high
// word of a·m is the quotient or one less, fixed by one comparison.
func (v Divisor) DivU(a uint64) (q, r uint64) {
	if v.m == 0 {
		return a, 0
	}
	q, _ = bits.Mul64(a, v.m)
	r = a - q*v.d
	if r >= v.d {
		q++
		r -= v.d
	}
	return q, r
}

// FloorDiv returns a/d rounded toward minus infinity, and the remainder
// in [0, d).
func (v Divisor) FloorDiv(a int64) (q, r int64) {
	if a >= 0 {
		uq, ur := v.DivU(uint64(a))
		return int64(uq), int64(ur)
	}
	q = FloorDiv(a, int64(v.d))
	return q, a - q*int64(v.d)
}

// CeilMulDiv returns ceil(a·b/d) for non-negative a and b with a·b/d below
// 2^63, using the reciprocal when a·b fits in 64 bits.
func (v Divisor) CeilMulDiv(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi == 0 {
		q, r := v.DivU(lo)
		if r != 0 {
			q++
		}
		return int64(q)
	}
	return CeilMulDiv(a, b, int64(v.d))
}

// WeightedRetry is the denial arithmetic of the weighted sliding window of
// length w, shared by the local and the Redis limiters. The window that
// starts at offset 0 holds cur units and the previous one prev, and n
// units were just denied: prev·(w-e)/w + cur + n > limit at the offset e
// of the request. It returns the offset of the first instant at which
// the same request fits if nothing else is admitted (in this window, when
// prev·(w-e') ≤ (limit-cur-n)·w, or else in the next, where cur becomes the
// previous count), and the offset at which the key is back to full.
func WeightedRetry(limit, w, prev, cur, n int64) (retry, reset int64) {
	if r := limit - cur - n; r >= 0 && prev > 0 {
		// A denial with r ≥ 0 means prev·(w-e) > r·w, so the quotient is
		// below w-e.
		if x, _ := MulDiv(r, w, prev); x > 0 {
			retry = w - x
		}
	}
	if retry == 0 { // not in this window: in the next one
		switch r := limit - n; {
		case r >= cur: // fits as the next window opens
			retry = w
		case r == 0: // only once cur has left too
			retry = 2 * w
		default: // 0 < r < cur: when cur·(w-e') ≤ r·w in the next window
			x, _ := MulDiv(r, w, cur)
			retry = 2*w - x
		}
	}
	reset = w // prev only
	if cur > 0 {
		reset += w
	}
	return retry, reset
}
