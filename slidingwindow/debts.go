package slidingwindow

import "github.com/throttlekit/throttle/internal/window"

// A key evicted by the MaxKeys cap while its window still holds units
// leaves its state word behind as a debt (keyed.Debtor), so that the key,
// or a new key sharing its cell of the debt table, starts from it rather
// than from an empty window. Merging two debts keeps, window by window,
// the larger count: never less strict than either.

// Evict marks the state dead and returns its word (0 if it was dead).
func (s *weighted) Evict() int64 { return window.Evict(&s.w) }

// Evict marks the state dead and returns its word (0 if it was dead). The
// ring is left behind: the debt counts every unit of the window as if
// admitted in the word's slot, which only delays their expiry.
func (s *slotted) Evict() int64 { return window.Evict(&s.w) }

// weightedDebts is the keyed.Debts of the weighted form.
type weightedDebts struct{ c *config }

// Merge moves the earlier word to the later one's window (its current
// count becomes the previous one, or both go when it is two windows or
// more behind) and keeps the larger of each count.
func (d weightedDebts) Merge(a, b int64) int64 {
	lay := d.c.lay
	if lay.Since(a, lay.Tag(b)) < 0 {
		a, b = b, a
	}
	prev, cur := lay.Hi(a), lay.Lo(a)
	switch lay.Since(a, lay.Tag(b)) {
	case 0:
	case 1:
		prev, cur = cur, 0
	default:
		prev, cur = 0, 0
	}
	return lay.Pack2(lay.Tag(b), max(prev, lay.Hi(b)), max(cur, lay.Lo(b)))
}

// Paid reports whether debt w holds no units at now.
func (d weightedDebts) Paid(w, now int64) bool { return d.c.fullWeighted(w, now) }

// Owe makes the fresh state s start from debt w.
func (d weightedDebts) Owe(s *weighted, w int64) {
	s.cfg.Store(d.c)
	s.w.Store(w)
}

// slottedDebts is the keyed.Debts of the slotted form. A debt is a state
// word read as "total units admitted in its slot".
type slottedDebts struct{ c *config }

// Merge keeps the later slot and the larger total, unless the earlier
// debt's units have all left the window by the later slot.
func (d slottedDebts) Merge(a, b int64) int64 {
	lay := d.c.lay
	if lay.Since(a, lay.Tag(b)) < 0 {
		a, b = b, a
	}
	total := lay.Hi(b)
	if lay.Since(a, lay.Tag(b)) < d.c.slots {
		total = max(total, lay.Hi(a))
	}
	return lay.Pack2(lay.Tag(b), total, total)
}

// Paid reports whether debt w holds no units at now.
func (d slottedDebts) Paid(w, now int64) bool { return d.c.fullSlotted(w, now) }

// Owe makes the fresh state s start from debt w: its whole total in its
// slot, so no ring is needed.
func (d slottedDebts) Owe(s *slotted, w int64) {
	lay := d.c.lay
	s.cfg.Store(d.c)
	s.w.Store(lay.Pack2(lay.Tag(w), lay.Hi(w), lay.Hi(w)))
}
