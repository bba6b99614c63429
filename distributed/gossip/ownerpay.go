package gossip

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/throttlekit/throttle"
)

// decideOwn decides n units of key on this node's bucket of it, started
// as startCold says. While the node hears no majority, it reads that
// bucket at the fallback rate and burst (see decideFallback): what it
// admits for a key it owns, before and while apart, then stays within one
// bucket, and the other nodes' fallback buckets add the rest of the bound.
func (l *OwnedLimiter) decideOwn(d *throttle.Decision, key string, n int) error {
	l.startCold(key)
	if !l.node.own.quorum.Load() {
		l.st.fallback.Add(1)
		return l.decideScaled(&l.exact, d, key, n, int(l.node.size.Load()))
	}
	return l.exact.Allow(d, key, n)
}

// startCold empties the bucket of key that this node is about to create,
// as of when it may have gained keys, if that was within a refill time
// (burst/rate): it restarted or joined a running cluster, a member left
// the owners, or it got its quorum back (see Node.coldSince). A key's
// previous owner, or this node's previous life, may have spent the
// bucket, so a restart or a move adds no burst. Two calls that create
// the same key at once may both empty it: stricter, never looser.
func (l *OwnedLimiter) startCold(key string) {
	since := l.node.coldSince()
	if since == 0 {
		return
	}
	if elapsed := l.node.clk.Now() - since; elapsed < int64(l.refill) && l.exact.Map().Load(key) == nil {
		if lack := int64(l.burst) - l.rate.Events(time.Duration(elapsed)); lack > 0 {
			_ = l.exact.Debit(key, lack) // the key was checked
		}
	}
}

// maxOwed bounds the keys whose fallback decisions a limiter holds to
// charge their owners; past it, what more keys admit on fallback buckets
// is counted in OwnedStats.Unowed and never charged.
const maxOwed = 1 << 20

// owe records n units of key admitted on its fallback bucket, to charge
// its owner when it answers again (see payBack).
func (l *OwnedLimiter) owe(key string, n int64) {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	if l.owed == nil {
		l.owed = map[string]int64{}
	}
	if _, ok := l.owed[key]; !ok && len(l.owed) >= min(maxOwed, l.node.settings.MaxKeys) {
		l.st.unowed.Add(uint64(n))
		return
	}
	l.owed[key] += n
	if l.payTimer == nil && !l.closed.Load() {
		l.payTimer = time.AfterFunc(l.node.Interval(), l.payBack)
	}
}

// payBack charges each key's owner what this node admitted for it on its
// fallback bucket, as all-to-all charges every node for what the others
// admitted: once this node hears a majority, each owner heard lately and
// answering gets a charge datagram (sent twice), and debits its bucket of
// each key, which may go negative. Keys now owned by this node are
// debited here. What cannot be charged yet waits for the next interval.
func (l *OwnedLimiter) payBack() {
	owners, quorum, live := *l.node.own.owners.Load(), l.node.own.quorum.Load(), *l.node.live.Load()
	l.mu.Lock()
	quiet := map[string]bool{}
	for o, b := range l.out {
		quiet[o] = !b.quiet.IsZero()
	}
	l.mu.Unlock()
	charges := map[string][]askEntry{}
	l.pmu.Lock()
	for key, n := range l.owed {
		if !quorum {
			break
		}
		switch o := ownerOf(key, owners); {
		case o == l.node.id:
			l.startCold(key)
			_ = l.exact.Debit(key, n) // the key was checked
			l.st.charged.Add(uint64(n))
		case live[o] == nil || quiet[o]:
			continue
		default:
			charges[o] = append(charges[o], askEntry{key: key, n: uint64(min(n, math.MaxInt32))})
		}
		delete(l.owed, key)
	}
	l.payTimer = nil
	if len(l.owed) > 0 && !l.closed.Load() {
		l.payTimer = time.AfterFunc(l.node.Interval(), l.payBack)
	}
	l.pmu.Unlock()
	for _, o := range slices.Sorted(maps.Keys(charges)) {
		n := l.node
		e := &encoder{hdr: header{typ: msgCharge, sender: n.id, table: l.name, incarnation: n.incarnation.Load(),
			round: uint64(n.tick.Load()), start: n.created}}
		for _, c := range charges[o] {
			e.addAsk(c)
		}
		bodies := e.finish()
		n.sendDirect(o, bodies, 2)
	}
}

// charged debits this node's buckets by what a peer admitted on its
// fallback buckets (see payBack). A charge datagram is applied once: its
// copies and replays are refused by the sequence window.
func (l *OwnedLimiter) charged(m *message) {
	for _, c := range m.asks {
		if l.node.settings.CheckKey(c.key) != nil {
			continue
		}
		l.startCold(c.key)
		if l.exact.Debit(c.key, int64(c.n)) == nil {
			l.st.charged.Add(c.n)
		}
	}
}
