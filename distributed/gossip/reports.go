package gossip

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
	"strings"
)

// pos is a position in the order in which a node sends its counters: by
// the round the counter changed in, then limiter name, then the order in
// which the round after took the limiter's changed entries (see
// Limiter.rotate). That order is fixed when the round takes them, so a
// round sends without sorting; an entry that changes again is taken
// again by a later round, so its position only moves forward. A round's
// entries whose list is no longer kept (for a peer far behind) are
// ordered by key instead (its hash in the table, then the key itself),
// after the positions of the list they were in, so that a peer that
// acknowledged part of that list gets them all.
type pos struct {
	ch   int64
	lim  string
	idx  uint32 // 1 + the entry's index in the limiter's list of round ch; keyed if ordered by key
	hash uint64 // if keyed, the key's hash in the limiter's table...
	key  string // ...and the key
}

// keyed is pos.idx of a position ordered by key.
const keyed = math.MaxUint32

func (a pos) cmp(b pos) int {
	return cmp.Or(cmp.Compare(a.ch, b.ch), strings.Compare(a.lim, b.lim), cmp.Compare(a.idx, b.idx),
		cmp.Compare(a.hash, b.hash), strings.Compare(a.key, b.key))
}

// run is a stretch of the send order: the entries of one limiter whose
// counters changed in round ch, from the list a round took (see
// Limiter.rotate) or, for a round whose list is no longer kept, from a
// scan of the table, sorted by key.
type run struct {
	ch    int64
	li    int      // the limiter's index in the round's limiters (sorted by name)
	list  *changes // nil for a scan's run
	keyed []*entry // a scan's run
}

// sendOrder is the order in which one round sends the counters changed
// since a position: the runs of every limiter, by round then limiter.
type sendOrder struct {
	lims []*Limiter
	from pos
	runs []run
}

// newSendOrder returns the order of the counters of lims changed at
// from or later (only those changed within the retention, at round r,
// if silent). A limiter whose kept lists do not go back to from.ch
// scans its table for the older rounds.
func newSendOrder(lims []*Limiter, r int64, from pos, silent bool) *sendOrder {
	o := &sendOrder{lims: lims, from: from}
	for li, l := range lims {
		l.histMu.Lock()
		oldest := from.ch
		if silent {
			oldest = max(oldest, r-l.retain)
		}
		if oldest < l.histFrom {
			l.scans++
			o.runs = append(o.runs, l.scanRuns(li, r, oldest)...)
		}
		for i := range l.hist {
			if h := &l.hist[i]; h.ch >= oldest {
				o.runs = append(o.runs, run{ch: h.ch, li: li, list: h})
			}
		}
		l.histMu.Unlock()
	}
	slices.SortFunc(o.runs, func(a, b run) int { return cmp.Or(cmp.Compare(a.ch, b.ch), cmp.Compare(a.li, b.li)) })
	return o
}

// scanRuns returns the runs of l's entries changed in a round from oldest
// on whose list is no longer kept, sorted by key: a scan of the table,
// for a peer further behind than the lists go. An entry taken again for
// a change in the round under way is left to its next list. Called with
// l.histMu held.
func (l *Limiter) scanRuns(li int, r, oldest int64) []run {
	type scanned struct {
		e  *entry
		ch int64
	}
	var ss []scanned
	l.table.each(func(_ string, e *entry) {
		if ch := e.changed.Load(); ch >= oldest && ch < l.histFrom && !l.listed(e) {
			ss = append(ss, scanned{e, ch})
		}
	})
	slices.SortFunc(ss, func(a, b scanned) int {
		return cmp.Or(cmp.Compare(a.ch, b.ch), cmp.Compare(a.e.hash, b.e.hash), strings.Compare(a.e.key, b.e.key))
	})
	var runs []run
	for i := 0; i < len(ss); {
		j := i
		es := make([]*entry, 0)
		for ; j < len(ss) && ss[j].ch == ss[i].ch; j++ {
			es = append(es, ss[j].e)
		}
		runs = append(runs, run{ch: ss[i].ch, li: li, keyed: es})
		i = j
	}
	return runs
}

// listed reports whether e is in one of l's kept lists, where it was
// last taken. Called with l.histMu held.
func (l *Limiter) listed(e *entry) bool {
	for i := range l.hist {
		if l.hist[i].at(e.seq) == e {
			return true
		}
	}
	return false
}

// at returns the entry taken with sequence number seq if this list
// holds it, else nil.
func (h *changes) at(seq uint32) *entry {
	if i := seq - h.base; i < uint32(len(h.es)) {
		return h.es[i]
	}
	return nil
}

// each calls f with the position, limiter index and entry of every
// entry of the runs from the run at index from on, at or after o.from,
// that is still in the list that took it last and not dropped, in
// order, until f returns false.
func (o *sendOrder) each(from int, f func(p pos, li int, e *entry) bool) {
	for _, ru := range o.runs[from:] {
		name := o.lims[ru.li].name
		switch c := cmp.Or(cmp.Compare(ru.ch, o.from.ch), strings.Compare(name, o.from.lim)); {
		case c < 0:
			continue
		case c > 0:
			if !ru.each(name, pos{}, f) {
				return
			}
		default:
			if !ru.each(name, o.from, f) {
				return
			}
		}
	}
}

// each is sendOrder.each over one run of limiter name, from position
// from of its round and limiter (the whole run if from is the zero
// pos).
func (ru *run) each(name string, from pos, f func(p pos, li int, e *entry) bool) bool {
	if ru.list != nil {
		h := ru.list
		start := 0
		if from.idx > 0 && from.idx != keyed {
			// (A keyed position before a list of the same round: the
			// limiter was made again since. Send it all.)
			start = int(from.idx) - 1
		}
		for i := start; i < len(h.es); i++ {
			e := h.es[i]
			if e == nil || e.pin.Load() < 0 {
				continue // taken again later, or dropped
			}
			if !f(pos{ch: ru.ch, lim: name, idx: uint32(i) + 1}, ru.li, e) {
				return false
			}
		}
		return true
	}
	for _, e := range ru.keyed {
		p := pos{ch: ru.ch, lim: name, idx: keyed, hash: e.hash, key: e.key}
		if p.cmp(from) < 0 {
			continue
		}
		if e.pin.Load() < 0 {
			continue
		}
		if !f(p, ru.li, e) {
			return false
		}
	}
	return true
}

// reportOf returns e's report entry, and false if it has no demand to
// report.
func reportOf(e *entry) (reportEntry, bool) {
	hits := uint64(e.hits.Load()) // read first: never more hits than demand
	demand := hits + uint64(e.unmet.Load())
	return reportEntry{key: e.key, born: e.born.Load(), hits: hits, demand: demand}, demand > 0
}

// entryBytes is what a report entry counts in a round's budget: its key
// and about 16 bytes of counters.
func entryBytes(e *entry) int { return len(e.key) + 16 }

// roundReports is what reports builds for the peers at one position.
type roundReports struct {
	bodies [][]byte
	to     pos   // the position before which every counter was sent ({r} if none was left out)
	parts  []pos // where each datagram starts
	resent int   // entries changed before the last round
}

// reports returns the bodies of round r's reports for peers that need
// the counters changed at position from and later (only those changed
// within the retention if silent: a peer not heard from lately), at most
// budget bytes of entries, those pending longest first.
//
// So that a backlog (a flood of new keys, a peer behind) cannot starve
// the keys in use now, a round that is cut or carries counters older
// than the last round run, prev, first carries, in up to a quarter of
// the budget, the busiest counters taken by this round. They do not move
// the acknowledged position (and are sent again in order later: counters
// are cumulative). The work is bounded by the budget, but for the
// busiest counters' selection, which looks at the counters this round
// took.
func (n *Node) reports(lims []*Limiter, r, prev int64, from pos, budget int, silent bool) roundReports {
	o := newSendOrder(lims, r, from, silent)
	out := roundReports{to: pos{ch: r}}
	var fresh []freshEntry
	if past, cut, backlog := o.fits(budget, prev); cut || backlog {
		fresh = o.busiest(budget/4, prev, past)
		for _, x := range fresh {
			budget -= entryBytes(x.e)
		}
	}
	w := reportWriter{n: n, lims: lims, r: r, out: &out}
	for _, x := range fresh {
		if rep, ok := reportOf(x.e); ok {
			w.add(x.li, rep, from)
		}
	}
	w.flush()
	size := 0
	o.each(0, func(p pos, li int, e *entry) bool {
		rep, ok := reportOf(e)
		if !ok {
			return true
		}
		if size += entryBytes(e); size > budget && size > entryBytes(e) {
			out.to = p
			return false
		}
		if p.ch < r-1 {
			out.resent++
		}
		w.add(li, rep, p)
		return true
	})
	w.flush()
	if n.cfg.Transport == nil {
		out.bodies = nil
	}
	return out
}

// fits walks the order until budget is spent: cut reports that it was,
// backlog that some counter changed before prev, the last round run, and
// past is where the busiest counters a round carries first are taken
// from: if it is cut, the first position past three quarters of budget
// (those before are sent in order anyway).
func (o *sendOrder) fits(budget int, prev int64) (past pos, cut, backlog bool) {
	size, k, most := 0, 0, budget-budget/4
	past = pos{ch: math.MaxInt64}
	o.each(0, func(p pos, _ int, e *entry) bool {
		if _, ok := reportOf(e); !ok {
			return true
		}
		backlog = backlog || p.ch < prev
		if size += entryBytes(e); size > most && past.ch == math.MaxInt64 {
			past = p
		}
		k++
		cut = size > budget && k > 1
		return !cut
	})
	if !cut {
		past = pos{} // sent whole: the busiest go first all the same
	}
	return past, cut, backlog
}

// freshEntry is one of the counters a round carries first.
type freshEntry struct {
	e    *entry
	li   int
	hits int64
}

// busiest returns the counters of the order taken by this round (changed
// in round prev, the last run, or since) at position past or later, most
// hits first, that fit in budget bytes, by limiter: a heap of the
// busiest so far, so that the work is linear in the counters this round
// took.
func (o *sendOrder) busiest(budget int, prev int64, past pos) []freshEntry {
	first := len(o.runs)
	for i, ru := range o.runs {
		if ru.ch >= prev {
			first = i
			break
		}
	}
	var h busy
	size, full := 0, false
	o.each(first, func(p pos, li int, e *entry) bool {
		if _, ok := reportOf(e); !ok || p.cmp(past) < 0 {
			return true
		}
		x, b := freshEntry{e, li, e.hits.Load()}, entryBytes(e)
		if !full && size+b <= budget {
			h, size = append(h, x), size+b
			return true
		}
		if !full {
			heap.Init(&h) // the fewest hits at the root from now on
			full = true
		}
		if len(h) == 0 || x.hits <= h[0].hits {
			return true
		}
		size += b - entryBytes(h[0].e)
		h[0] = x
		heap.Fix(&h, 0)
		for size > budget && len(h) > 1 {
			size -= entryBytes(heap.Pop(&h).(freshEntry).e)
		}
		return true
	})
	slices.SortStableFunc(h, func(a, b freshEntry) int {
		return cmp.Or(cmp.Compare(a.li, b.li), cmp.Compare(b.hits, a.hits))
	})
	return h
}

// busy is a heap of counters, the fewest hits first.
type busy []freshEntry

func (h busy) Len() int           { return len(h) }
func (h busy) Less(i, j int) bool { return h[i].hits < h[j].hits }
func (h busy) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *busy) Push(x any)        { *h = append(*h, x.(freshEntry)) }
func (h *busy) Pop() any {
	x := (*h)[len(*h)-1]
	*h = (*h)[:len(*h)-1]
	return x
}

// reportWriter encodes a round's report entries into datagrams, a new
// one where the limiter changes, and records where each starts.
type reportWriter struct {
	n    *Node
	lims []*Limiter
	r    int64
	out  *roundReports
	enc  *encoder
	li   int
}

// add encodes rep, of limiter li, at position p.
func (w *reportWriter) add(li int, rep reportEntry, p pos) {
	if w.enc != nil && li != w.li {
		w.flush()
	}
	if w.enc == nil {
		w.li = li
		w.enc = &encoder{hdr: header{typ: msgReport, sender: w.n.id, table: w.lims[li].name,
			incarnation: w.n.incarnation.Load(), round: uint64(w.r), start: w.n.created}}
	}
	if w.enc.addReport(rep) {
		w.out.parts = append(w.out.parts, p)
	}
}

// flush ends the datagrams of the current limiter.
func (w *reportWriter) flush() {
	if w.enc != nil {
		w.out.bodies = append(w.out.bodies, w.enc.finish()...)
		w.enc = nil
	}
}
