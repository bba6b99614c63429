package gossip

// expire drops entries idle for retain rounds that every live peer has
// acknowledged (minAck), whose peer records are gone and whose bucket is
// full: records are kept until their sender can no longer resend them,
// and a bucket below full (peers' debits may leave it in debt for longer
// than the retention) until it has refilled. A round sweeps 1/expireRounds
// of the table, so that its work does not grow with every key held: an
// idle entry goes up to expireRounds rounds after it could.
func (l *Limiter) expire(r, minAck int64) {
	now := l.node.clk.Now()
	idle := func(e *entry) bool {
		ch := e.changed.Load()
		return ch < r-l.retain && ch < minAck && e.tat() <= now
	}
	l.histMu.Lock()
	from := l.sweep
	l.histMu.Unlock()
	next := l.table.sweep(from, expireRounds, func(key string, e *entry) {
		// A peer's record is kept for a sweep longer than its counter
		// could be idle and still be sent (the peer's own sweep may keep
		// it that much longer): a record dropped while its counter lives
		// on would have that counter's hits charged again.
		if idle(e) && e.pruneRemote(r-l.retain-expireRounds) {
			// A decision or report may have come and gone between the
			// look and the drop: look again once no new one can pin e.
			l.table.drop(key, e, func() bool { return idle(e) && e.noRemote() })
		}
	})
	l.histMu.Lock()
	l.sweep = next
	l.histMu.Unlock()
}

// expireRounds is how many rounds an expiry sweep of the whole table
// takes.
const expireRounds = 8

// changes is what one round took from a limiter's dirty entries: those
// whose counters changed in round ch, the round run before it, in the
// order it took them. The entry at index i was given sequence number
// base+i (see entry.seq); a later round that takes it again clears its
// slot (nil).
type changes struct {
	ch   int64
	base uint32
	es   []*entry
}

// histRounds is how many rounds run of changes beyond Config.Resend a
// limiter keeps, for peers that acknowledged a round or two late: a peer further
// behind gets its reports from a scan of the whole table.
const histRounds = 4

// rotate takes the entries changed since the last round, prev, at the
// start of round r, and keeps them with those of the latest rounds, each
// numbered in the order taken: the order the rounds send them in (see
// pos). An entry added with a round older than prev (by a decision that
// read the round just before it moved on) is moved forward to prev, so
// that a peer that acknowledged everything before prev still gets it.
// An entry that changed in round r already (after the round began) is
// also added back, for the next round to take it again: its changes
// after this round reads it are news.
func (l *Limiter) rotate(r, prev int64) {
	l.histMu.Lock()
	defer l.histMu.Unlock()
	// The last rounds run, not round numbers: rounds run seconds apart (a
	// starved process) keep as many, else a peer's acknowledged round would
	// always be older than them, and every round would scan the table.
	var spare []*entry
	if k := len(l.hist) + 1 - l.node.cfg.Resend - histRounds; k > 0 {
		for _, h := range l.hist[:k] {
			l.histFrom = h.ch + 1
		}
		spare = l.hist[0].es[:cap(l.hist[0].es)]
		clear(spare) // it holds no dropped entry alive
		l.hist = append(l.hist[:0], l.hist[k:]...)
	}
	es := l.dirty.take(spare[:0])
	h := changes{ch: prev, base: l.seq, es: es}
	for i, e := range es {
		for c := e.changed.Load(); c < prev && !e.changed.CompareAndSwap(c, prev); c = e.changed.Load() {
		}
		if e.changed.Load() > prev {
			l.dirty.add(e)
		}
		l.unlist(e, h.es[:i], h.base)
		e.seq = h.base + uint32(i)
	}
	l.seq += uint32(len(es))
	l.hist = append(l.hist, h)
}

// unlist clears e's slot in the list that last took it, if any: a kept
// one, or taking, the entries the round being taken numbered so far from
// base. A round walks past a cleared slot without reading the entry.
// Called with l.histMu held.
func (l *Limiter) unlist(e *entry, taking []*entry, base uint32) {
	if h := (changes{base: base, es: taking}); h.clear(e) {
		return
	}
	for i := range l.hist {
		if l.hist[i].clear(e) {
			return
		}
	}
}

// clear clears e's slot in h, if h holds it, and reports whether it did.
func (h *changes) clear(e *entry) bool {
	if i := e.seq - h.base; i < uint32(len(h.es)) && h.es[i] == e {
		h.es[i] = nil
		return true
	}
	return false
}
