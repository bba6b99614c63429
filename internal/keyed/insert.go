package keyed

// Inserting a key, and rebuilding a shard's table to make room.

// filler is implemented by a state that must be set up before its key is
// published (Box).
type filler interface{ fill() }

func (m *Map[S, P]) insert(sh *shard[S], tag uint64, key string) P {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		return &sl.state
	}
	m.sweepSome(sh, sweepLook)
	if m.keys.Load() >= int64(m.set.MaxKeys) && !m.evictOne(sh) {
		m.evictElsewhere(sh)
	}
	sl := m.room(sh).claim(tag)
	sl.id = idOf(m.ids, key)
	p := P(&sl.state)
	if f, ok := any(p).(filler); ok {
		f.fill()
	}
	if m.debts != nil && m.hasDebts.Load() {
		if d := m.owed(debtHash(tag), sh.Now()); d != 0 {
			m.debts.Owe(p, d)
		}
	}
	// A new key starts referenced: wherever its slot lies ahead of the
	// eviction hand, it lives at least one turn of the hand.
	sl.tag.Store(tag | refBit)
	sh.n++
	sh.keys.Add(1)
	return p
}

// room returns sh's table with room for one more key, rebuilding it first
// when live and gone slots would pass three quarters of it: the new table
// is twice the live keys, so that it stays between half and three
// quarters full, and every live state moves to it. sh.mu must be held.
func (m *Map[S, P]) room(sh *shard[S]) *table[S] {
	if t := sh.tab.Load(); 4*(t.used+1) <= 3*len(t.slots) {
		return t
	}
	return m.rebuild(sh)
}

// rebuild replaces sh's table by one of twice its live keys (plus one),
// moving every live state to it; sh.mu must be held.
func (m *Map[S, P]) rebuild(sh *shard[S]) *table[S] {
	t := sh.tab.Load()
	nt := newTable[S](max(minTable, 2*(sh.n+1)))
	for i := range t.slots {
		sl := &t.slots[i]
		tag := sl.tag.Load()
		if tag&liveBit == 0 {
			continue
		}
		to := nt.claim(tag &^ refBits)
		to.id = sl.id
		P(&sl.state).Move(&to.state)
		to.tag.Store(tag)
	}
	sh.tab.Store(nt) // readers of t find the moved states dead and look again
	// Shards hold about as many keys each, so this table's size stands
	// for all of them; cold is a hint, and only ever costs or saves time.
	if c := len(nt.slots) >= m.coldAt; c != m.cold.Load() {
		m.cold.Store(c)
	}
	sh.hand, sh.sweep = 0, 0
	return nt
}
