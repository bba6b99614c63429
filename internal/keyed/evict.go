package keyed

// The MaxKeys cap: evicting a key by CLOCK, from its own shard or another.

// evictElsewhere evicts one key from a shard other than own whose lock it
// can take without waiting; own.mu is held. If none gives one, the map
// grows past its cap (a soft cap, so that slots held by a concurrency
// limiter are never forgotten, and an insert never waits on a second lock).
func (m *Map[S, P]) evictElsewhere(own *shard[S]) {
	start := int(m.next.Add(1))
	for i := range min(len(m.shards), evictTries) {
		o := &m.shards[(start+i)&int(m.mask)]
		if o == own || !o.mu.TryLock() {
			continue
		}
		ok := m.evictOne(o)
		o.mu.Unlock()
		if ok {
			return
		}
	}
}

// evictTries bounds how many other shards one insert asks to evict, and
// evictLook how many states may refuse in each.
const (
	evictTries = 4
	evictLook  = 64
)

// evictOne frees one key of sh by the CLOCK policy and reports whether it
// did; sh.mu must be held. It fails when every state refuses.
func (m *Map[S, P]) evictOne(sh *shard[S]) bool {
	// Three turns of the hand find a victim unless every key was used
	// again meanwhile: each pass clears the highest reference bit it
	// finds (againBit, then refBit; each cleared bit paid for by the
	// look-up that set it), so a key used once goes before a key used
	// again since the hand last passed it. The hand resumes where it
	// stopped, and at most evictLook states may refuse, so the look costs
	// O(1) per insert even when most states refuse (units held by
	// counting): such a map grows past its cap a little instead of
	// scanning every key.
	t := sh.tab.Load()
	refused := 0
	for range 3 * len(t.slots) {
		if sh.hand++; sh.hand >= len(t.slots) {
			sh.hand = 0
		}
		sl := &t.slots[sh.hand]
		tag := sl.tag.Load()
		p := P(&sl.state)
		switch {
		case tag&liveBit == 0:
			continue
		case tag&againBit != 0:
			sl.tag.And(^uint64(againBit))
			continue
		case tag&refBit != 0:
			sl.tag.And(^uint64(refBit))
			continue
		case refused == evictLook:
			return false
		case p.Retire(sh, false):
		case m.debts != nil:
			if d := any(p).(Debtor).Evict(); d != 0 {
				m.evictions.Add(1)
				m.leave(debtHash(tag), d, sh.Now())
			}
		case p.Retire(sh, true):
			m.evictions.Add(1)
		default:
			refused++
			continue
		}
		sh.remove(sl)
		return true
	}
	return false
}

// Evictions returns how many keys were evicted by the MaxKeys cap while
// their state was not full.
func (m *Map[S, P]) Evictions() uint64 { return m.evictions.Load() }
