package gossip

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
)

// Tick runs one gossip round if a round boundary has passed since the
// last one, and reports whether it did. A round sends every peer that is
// alive the counters that changed since the latest round it acknowledged
// (at least those of the last Resend rounds), the next part of its
// bucket levels to a peer that is new or restarted (half of the peer's
// budget, resumed after what it acknowledged, until it has them all), and
// a hello to the others; then it drops idle state. Rounds run one at a
// time: a Tick waits for one under way (Start's loop, or another caller).
func (n *Node) Tick() bool {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	rd := n.beginRound(n.clk.Now())
	if rd == nil {
		return false
	}
	for _, l := range rd.lims {
		l.rotate(rd.r, rd.prev)
	}
	n.st.rounds.Add(1)
	order := slices.SortedFunc(maps.Keys(rd.groups), func(a, b group) int {
		return cmp.Or(a.from.cmp(b.from), cmp.Compare(a.budget, b.budget))
	})
	behind := false
	for _, g := range order {
		behind = n.sendReports(rd, g, rd.groups[g]) || behind
	}
	if behind {
		n.st.behind.Add(1)
	}
	if len(rd.silent) > 0 {
		// What changed since the last round run, however late it ran.
		rep := n.reports(rd.lims, rd.r, rd.prev, pos{ch: min(rd.r-int64(n.cfg.Resend), rd.prev)}, n.cfg.MaxRoundBytes, true)
		for _, d := range rd.silent {
			n.send(d.addr, d.ack, rep.bodies, rd.r)
		}
	}
	for _, l := range rd.lims {
		l.expire(rd.r, rd.minAck)
	}
	return true
}

// round is what a round sends, planned at its start under the node's
// mutex.
type round struct {
	r, prev int64      // the round, and the one run before it
	lims    []*Limiter // sorted by name
	groups  map[group][]dest
	silent  []dest // peers sent only what changed lately
	minAck  int64  // the oldest round a live peer has not acknowledged
}

// dest is a peer a round sends to.
type dest struct {
	addr string
	ack  uint64
	cu   *catchUp // bucket levels to send the peer, if not nil
	inc  uint64
}

// group is the peers sent the same reports: from the same position, with
// the same budget.
type group struct {
	from   pos
	budget int
}

// beginRound starts the round of now, if a round boundary has passed
// since the last one (else it returns nil), and plans what it sends each
// peer.
func (n *Node) beginRound(now int64) *round {
	r := now / n.interval
	n.mu.Lock()
	if n.closed || r <= n.round {
		n.mu.Unlock()
		return nil
	}
	rd := &round{r: r, prev: n.round, groups: map[group][]dest{}, minAck: r}
	n.round = r
	n.tick.Store(r)
	if inc := n.ms.Local().Incarnation; inc > n.incarnation.Load() {
		// The membership moved this node's life past an older one.
		n.incarnation.Store(inc)
	}
	// Sorted iteration keeps simulations on the in-memory network
	// reproducible.
	changed := false
	for _, addr := range slices.Sorted(maps.Keys(n.peers)) {
		changed = n.plan(rd, n.peers[addr], now) || changed
	}
	if changed {
		n.publishMembers()
	}
	n.gate(now)
	if len(n.early) > 0 {
		n.pruneEarly(r, "", 0)
	}
	for _, l := range n.limiters {
		rd.lims = append(rd.lims, l)
	}
	n.mu.Unlock()
	slices.SortFunc(rd.lims, func(a, b *Limiter) int { return strings.Compare(a.name, b.name) })
	return rd
}

// plan adds what round rd sends peer p to rd, and reports whether p
// went dead or came back. Called with n.mu held.
func (n *Node) plan(rd *round, p *peer, now int64) (changed bool) {
	d := dest{addr: p.addr, ack: p.rxComplete, inc: p.incarnation}
	if dead := p.unheard(now, n.deadAfter(), rd.prev*n.interval); dead != p.dead {
		p.dead, changed = dead, true
	}
	if p.dead || p.down {
		// Not heard from (yet, or lately), or declared dead: hello only, until it
		// speaks; then it gets all it has not acknowledged. Its
		// share of the tokens goes to the live members.
		rd.silent = append(rd.silent, d)
		return changed
	}
	d.cu = p.catchingUp()
	since := min(rd.r-int64(n.cfg.Resend), int64(p.acked))
	rd.minAck = min(rd.minAck, int64(p.acked))
	p.adapt(rd.r, n.cfg.MaxRoundBytes)
	from := pos{ch: since}
	if since == int64(p.acked) {
		from = p.ackedPos
	}
	g := group{from, p.budget}
	if d.cu != nil {
		g.budget = max(p.budget/2, MaxPacket) // the other half for the levels
	}
	rd.groups[g] = append(rd.groups[g], d)
	return changed
}

// adapt sets the peer's report budget for round r, like TCP's congestion
// window: most at first, raised while the peer acknowledges rounds,
// halved once per round trip while it does not. Called with n.mu held.
func (p *peer) adapt(r int64, most int) {
	switch {
	case p.budget == 0:
		p.budget = most
	case int64(p.ackSeen) >= r-2:
		p.budget = min(p.budget+8*MaxPacket, most)
	case len(p.sent) > 0 && r-p.cutAt >= 2:
		// Halve once per round trip: the rounds sent since the last
		// cut are not answered yet.
		p.budget = max(p.budget/2, MaxPacket)
		p.cutAt = r
	}
}

// sendReports sends the peers ds of group g their reports of round rd,
// and the bucket levels of those catching up, and records what it sent.
// It reports whether the reports left changed counters for later rounds.
func (n *Node) sendReports(rd *round, g group, ds []dest) (behind bool) {
	rep := n.reports(rd.lims, rd.r, rd.prev, g.from, g.budget, false)
	n.st.resent.Add(uint64(rep.resent * len(ds)))
	n.mu.Lock()
	for _, d := range ds {
		if p := n.peers[d.addr]; p != nil {
			if p.sent == nil || len(p.sent) > 1024 {
				p.sent = map[uint64]sentRound{}
			}
			p.sent[uint64(rd.r)] = sentRound{from: g.from, to: rep.to, parts: rep.parts}
		}
	}
	n.mu.Unlock()
	for _, d := range ds {
		b := rep.bodies
		if d.cu != nil {
			b = append(b[:len(b):len(b)], n.catchUpBodies(d.cu, rd.lims, rd.r, g.budget, len(b), d.addr, d.inc)...)
		}
		n.send(d.addr, d.ack, b, rd.r)
	}
	return rep.to.cmp(pos{ch: rd.r}) < 0
}

// send seals bodies for one peer (a hello if there are none) and sends
// them.
func (n *Node) send(addr string, ack uint64, bodies [][]byte, r int64) {
	if n.cfg.Transport == nil {
		return
	}
	if len(bodies) == 0 {
		bodies = n.encode(msgHello, "", r, func(*encoder) {})
	}
	if len(bodies) > math.MaxUint16 {
		// Not within maxMaxRoundBytes: a round cut here would be
		// acknowledged as if whole.
		bodies = bodies[:math.MaxUint16]
	}
	n.mu.Lock()
	pr := n.peers[addr]
	if pr == nil {
		n.mu.Unlock()
		return // left meanwhile
	}
	sealed := make([][]byte, len(bodies))
	for i, b := range bodies {
		pr.seq++
		sealed[i] = n.sendSig.seal(b, addr, header{ack: ack, part: uint16(i), parts: uint16(len(bodies)), seq: pr.seq,
			dstInc: pr.incarnation, pround: pr.rxRound, prefix: pr.rxPrefix})
	}
	n.mu.Unlock()
	// Copies go out after the whole round rather than back to back, so
	// that a short burst of loss does not take every copy of a datagram.
	for range n.cfg.Copies {
		for _, p := range sealed {
			if err := n.cfg.Transport.Send(addr, p); err != nil {
				n.st.sendErr.Add(1)
				continue
			}
			n.st.sent.Add(1)
			n.st.bytes.Add(uint64(len(p)))
		}
	}
}

// encode returns the unsealed bodies of one message type.
func (n *Node) encode(typ byte, table string, r int64, fill func(*encoder)) [][]byte {
	if n.cfg.Transport == nil {
		return nil
	}
	e := &encoder{hdr: header{typ: typ, sender: n.id, table: table, incarnation: n.incarnation.Load(), round: uint64(r), start: n.created}}
	fill(e)
	return e.finish()
}
