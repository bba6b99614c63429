package keyed

// The debt table: what evicted keys owed, so that they do not come back fresh.

// Debtor is implemented by a state that leaves its debt behind when the
// MaxKeys cap evicts it, so that the key (or one that collides with it)
// does not come back fresh: the gubernator #98 bypass.
type Debtor interface {
	// Evict marks the state dead unconditionally and returns the word it
	// replaced: its debt, 0 for none. A dead state returns 0.
	Evict() int64
}

// Debts is the algorithm side of the debt table; see Map.SetDebts.
type Debts[P any] interface {
	// Merge returns a debt at least as strict as each of a and b.
	Merge(a, b int64) int64
	// Paid reports whether debt d is paid at now (the state would be full).
	Paid(d, now int64) bool
	// Owe makes the fresh state p owe d.
	Owe(p P, d int64)
}

// debtCell is one cell of the debt table: a debt and the fingerprint of
// the key that left it, or merged when several keys did.
type debtCell struct {
	fp   uint32
	debt int64
}

const merged = 1 // the fingerprint of a cell merged from several keys

// SetDebts turns on the debt table: states evicted by the MaxKeys cap
// while owing (their Evict word is not 0) leave their debt in a table of
// 2·MaxKeys cells indexed by key hash, allocated at the first such
// eviction; a new key starts from its own cell's debt, or from a cell that
// several keys' debts were merged into. A cell is cleared once its debt is
// paid. It must be called before the map is used, and only if P
// implements Debtor.
func (m *Map[S, P]) SetDebts(d Debts[P]) { m.debts = d }

// debtHash returns the hash the debt table files the key of tag under:
// its bits above the shard's.
func debtHash(tag uint64) uint64 { return tag >> 8 }

func fingerprint(h uint64) uint32 { return uint32(h>>32) | 2 }

// cells returns the two cells of hash h; m.debtMu must be held.
func (m *Map[S, P]) cells(h uint64) (*debtCell, *debtCell) {
	mask := uint64(len(m.table) - 1)
	return &m.table[h&mask], &m.table[(h>>20)&mask]
}

// leave records debt d of the key of hash h.
func (m *Map[S, P]) leave(h uint64, d int64, now int64) {
	m.debtMu.Lock()
	defer m.debtMu.Unlock()
	if m.table == nil {
		size := 2
		for size < 2*m.set.MaxKeys {
			size *= 2
		}
		m.table = make([]debtCell, size)
		m.hasDebts.Store(true)
	}
	fp := fingerprint(h)
	a, b := m.cells(h)
	for _, c := range [2]*debtCell{a, b} {
		if c.debt != 0 && m.debts.Paid(c.debt, now) {
			*c = debtCell{}
		}
	}
	switch {
	case a.fp == fp:
		a.debt = m.debts.Merge(a.debt, d)
	case b.fp == fp:
		b.debt = m.debts.Merge(b.debt, d)
	case a.debt == 0:
		*a = debtCell{fp, d}
	case b.debt == 0:
		*b = debtCell{fp, d}
	default: // both taken by others: merge into the first
		*a = debtCell{merged, m.debts.Merge(a.debt, d)}
	}
}

// owed returns the debt a new key of hash h starts from (0 for none),
// taking its own cell's debt out of the table.
func (m *Map[S, P]) owed(h uint64, now int64) int64 {
	m.debtMu.Lock()
	defer m.debtMu.Unlock()
	if m.table == nil {
		return 0
	}
	fp := fingerprint(h)
	a, b := m.cells(h)
	var d int64
	for _, c := range [2]*debtCell{a, b} {
		switch {
		case c.debt == 0:
		case m.debts.Paid(c.debt, now):
			*c = debtCell{}
		case c.fp == fp:
			d = merge(m.debts, d, c.debt)
			*c = debtCell{}
		case c.fp == merged:
			d = merge(m.debts, d, c.debt)
		}
	}
	return d
}

func merge[P any](ds Debts[P], a, b int64) int64 {
	if a == 0 {
		return b
	}
	return ds.Merge(a, b)
}
