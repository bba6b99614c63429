package slidinglog

import (
	"math"
	"math/bits"
)

// A key evicted by the MaxKeys cap while its log still holds units leaves a
// debt behind (keyed.Debtor), so that the key, or a new key sharing its
// cell of the debt table, starts from it rather than from an empty log.
//
// A debt packs, in 64 bits, the units the log held and the instant of its
// newest entry, rounded up to a grain of 2^bits.Len(limit) ns (1 µs for a
// limit of 1,000, 1 ms for 1,000,000, 4.3 s for 2^32-1; above that the
// instant is exact and the log counts as full): the key starts again with
// all those units admitted at that instant. Every unit thus leaves the window no
// earlier than it would have, and at most one grain later: the debt errs
// toward denial only. Instants are stored with their sign bit flipped, so
// that the order holds across 1970; a debt is never 0 (it holds a unit).

// grainBits returns the bits of an instant that a debt drops: as many as
// the count needs, for limits up to 2^32-1. Above that a debt keeps the
// instant alone, to the nanosecond, and counts the log as full: stricter,
// for limits no log reaches in practice.
func (p *params) grainBits() uint {
	if b := uint(bits.Len64(uint64(p.limit))); b <= 32 {
		return b
	}
	return 0
}

// debt returns the debt of total units (0 < total <= limit) whose newest
// admission was at last.
func (p *params) debt(total, last int64) int64 {
	g := p.grainBits()
	u := uint64(last) ^ 1<<63 // sign bit flipped
	if g == 0 {
		return int64(max(u, 1)) // never 0; at the earliest instant, 1 ns late
	}
	t := u >> g
	if u&(1<<g-1) != 0 && t < math.MaxUint64>>g {
		t++ // round up: later, so stricter
	}
	return int64(t<<g | uint64(total))
}

// owed splits a debt into its units and the instant they count at.
func (p *params) owed(d int64) (total, at int64) {
	g := p.grainBits()
	u := uint64(d)
	if g == 0 {
		return p.limit, int64(u ^ 1<<63)
	}
	return int64(u & (1<<g - 1)), int64(u>>g<<g ^ 1<<63)
}

// Evict kills the log and returns its debt (0 if it was dead or empty).
// It implements keyed.Debtor.
func (s *state) Evict() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead() {
		return 0
	}
	var d int64
	if s.total > 0 {
		d = s.p.debt(s.total, s.newest(s.p))
	}
	s.kill()
	return d
}

// debts is the keyed.Debts of a Limiter.
type debts struct{ p *params }

// Merge keeps the later instant and the larger count.
func (d debts) Merge(a, b int64) int64 {
	ta, at := d.p.owed(a)
	tb, bt := d.p.owed(b)
	if at < bt {
		at = bt
	}
	return d.p.debt(max(ta, tb), at)
}

// Paid reports whether the units of debt w have left the window at now.
func (d debts) Paid(w, now int64) bool {
	_, at := d.p.owed(w)
	return at <= now && uint64(now-at) >= uint64(d.p.window)
}

// Owe makes the fresh state s start from debt w: one admission of its
// units at its instant, which the log takes as the latest time it has
// seen (it may lie a grain ahead of the clock).
func (d debts) Owe(s *state, w int64) {
	s.p = d.p
	total, at := d.p.owed(w)
	s.push(d.p, at, total)
	s.seen = at ^ math.MinInt64
}
