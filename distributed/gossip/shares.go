package gossip

import (
	"math"
	"slices"
)

// shares is what quota derives from the members' reports for a round:
// their weights and the tokens set aside for reports not arrived yet. It
// changes only when the round, the members or e's peer records do, or a
// pending member's round arrives, so e keeps it, and a change to the
// records marks it stale (see entry.sharesChanged).
type shares struct {
	round   int64
	members *[]string // the member list it was computed for; nil when stale
	of      *[]string // likewise, never cleared: the members w is for
	pending bool      // some member was pending (see Limiter.shares): compute again at each use
	w       []float64 // each member's weight, in members' order; never all 0
	sum     float64   // of w
	self    int       // this node's index in members
	held    int64     // tokens set aside for what pending members may have spent
	total   int64     // the total of the last quota computed
	quota   int64     // and that quota
}

// portion is one member's part of the tokens in quota: its whole units
// and the fraction left over.
type portion struct {
	whole int64
	frac  float64
}

// shares returns e's shares for round r among the members of mp,
// computing them if they are stale. Called with e.mu held, after
// e.begin(r).
//
// A peer's counters changed in round r-1 reach this node in its round r
// datagrams, which are in flight at the start of round r (or lost). Until
// they are in (the peer's report of the key for round r arrived, or all
// of its round r datagrams did, and so the key was not among them), the
// peer is pending: it may have spent, in round r-1, up to its quota then,
// which this node has not been charged for. For a pending peer the shares
// therefore keep its fraction of round r-1, as this node computed it
// (1/N if it computed none), and set aside that fraction of what round
// r-1 could spend (the tokens at the start of round r, plus what this
// node and the peers heard from spent in r-1), plus one unit for
// rounding; or its recent hit rate over the rounds it is late, if that
// is more. If every node saw the same round r-1, what the pending peers
// may have spent and what this node may spend now add up to no more than
// one bucket holds: the burst bound holds while reports are in flight.
func (l *Limiter) shares(e *entry, mp *[]string, r int64) *shares {
	sh := &e.cap.shares
	if sh.round == r && sh.members == mp && !e.cap.arrived(r) {
		return sh
	}
	e.cap.keepLast(r)
	members := *mp
	var pbuf [16]bool
	var lbuf [16]float64
	pending, late := pbuf[:0], lbuf[:0]
	if len(members) > len(pbuf) {
		pending, late = make([]bool, 0, len(members)), make([]float64, 0, len(members))
	}
	pending, late = pending[:len(members)], late[:len(members)]
	sh.reset(r, mp)
	e.cap.waiting = e.cap.waiting[:0]
	// What round r-1 could spend: the tokens at the start of round r,
	// with what was spent in it.
	spendable := float64(l.bucket.Tokens(r*l.node.interval, e.tat()) + e.spent + e.cap.prevSpent)
	live := *l.node.live.Load()
	for i, id := range members {
		if id == l.node.id {
			sh.self = i
			sh.w[i] = float64(min(e.cap.prev, l.demand))
			continue
		}
		rec, p := e.peerRec(id), live[id]
		done := int64(0)
		if p != nil {
			done = int64(p.done.Load())
		}
		if done < r {
			late[i] = recentHits(rec, r)
		}
		if rec != nil && rec.r1 >= uint64(r) || p == nil || done >= r || done < r-pendingRounds {
			// Heard for round r: what it spent in r-1 is charged. (Or
			// never heard, or not for rounds: see the late estimate.)
			w, spent := l.heard(rec, r)
			sh.w[i], spendable = w, spendable+spent
			continue
		}
		pending[i], sh.pending = true, true
		e.cap.waiting = append(e.cap.waiting, p)
		sh.w[i] = e.cap.lastFraction(id, r, len(members))
	}
	sh.held = held(sh.w, pending, late, spendable)
	sh.spread(pending)
	return sh
}

// keepLast keeps the shares of round r-1, if they are the latest
// computed, before they are computed for round r: a pending member keeps
// its fraction of r-1. Called with the entry's mu held.
func (c *spending) keepLast(r int64) {
	if sh, last := &c.shares, &c.last; sh.round == r-1 && sh.of != nil && last.round != r-1 {
		last.round, last.of, last.sum = r-1, sh.of, sh.sum
		last.w = append(last.w[:0], sh.w...)
	}
}

// lastFraction returns the fraction of the tokens the member with ID id,
// pending in round r, had in round r-1 as this node computed it: 1/n if
// it computed none, n being the members now. Called with the entry's mu
// held.
func (c *spending) lastFraction(id string, r int64, n int) float64 {
	last := &c.last
	if last.round != r-1 {
		return 1 / float64(n)
	}
	if k, ok := slices.BinarySearch(*last.of, id); ok {
		return last.w[k] / last.sum
	}
	return 0
}

// reset starts computing sh for round r and the members of mp.
func (sh *shares) reset(r int64, mp *[]string) {
	n := len(*mp)
	sh.round, sh.members, sh.of, sh.pending = r, mp, mp, false
	if cap(sh.w) < n {
		sh.w = make([]float64, n)
	}
	sh.w = sh.w[:n]
	clear(sh.w)
	sh.sum, sh.self, sh.total = 0, 0, math.MinInt64
}

// heard returns the weight in round r of a peer heard for it, whose
// record of the key is rec (nil if none): the demand it reported last,
// all of it since its report before; and what it spent in round r-1,
// which this node was charged.
//
// The weight is never averaged over the rounds between the two reports:
// a counter is reported in the round after it changes, so a key idle for
// k rounds and then asked for has all of that demand in the last round,
// which is what the peer weighs itself by (spending.prev). Averaged, a
// peer back from idle weighed 1/k of its own weight here, each node took
// the others for idle and itself for busy, and their quotas added up to
// up to N times the tokens left. Weighing a peer at least as much as it
// weighs itself keeps the quotas of all nodes within the tokens left.
func (l *Limiter) heard(rec *remoteRec, r int64) (w, spent float64) {
	if rec == nil || rec.r1 <= rec.r0 {
		return 0, 0
	}
	if rec.r1 >= uint64(r) {
		spent = float64(rec.h1 - rec.h0)
	}
	if rec.r1 >= uint64(r-1) {
		w = min(float64(rec.d1-rec.d0), float64(l.demand))
	}
	return w, spent
}

// recentHits estimates what a peer whose record of the key is rec (nil
// if none), not heard for round r, spent in the 1 to 3 rounds it is
// late: its hit rate lately. 0 if later than that.
func recentHits(rec *remoteRec, r int64) float64 {
	if rec == nil || rec.r1 <= rec.r0 {
		return 0
	}
	if n := r - int64(rec.r1); n >= 1 && n <= 3 {
		return float64(n) * float64(rec.h1-rec.h0) / float64(rec.r1-rec.r0)
	}
	return 0
}

// held returns the tokens set aside for what the members may have spent
// unheard: for a pending one, its fraction w of what round r-1 could
// spend, plus one for rounding; or its recent hit rate (late), if more.
func held(w []float64, pending []bool, late []float64, spendable float64) int64 {
	h := 0.0
	for i := range w {
		x := 0.0
		if pending[i] && w[i] > 0 {
			x = math.Ceil(w[i]*max(spendable, 0)) + 1
		}
		h += max(x, late[i])
	}
	return int64(math.Ceil(h))
}

// spread turns the weights into the members' parts of the tokens: the
// pending members keep their fractions; the others share the rest by
// their weights (equally if none has any).
func (sh *shares) spread(pending []bool) {
	nonPending, pendingFrac := 0.0, 0.0
	for i, w := range sh.w {
		if pending[i] {
			pendingFrac += w
		} else {
			nonPending += w
		}
	}
	if nonPending == 0 {
		for i := range sh.w {
			if !pending[i] {
				sh.w[i] = 1
				nonPending++
			}
		}
	}
	rest := max(1-pendingFrac, 0)
	for i := range sh.w {
		if pending[i] {
			sh.w[i] *= nonPending
		} else {
			sh.w[i] *= rest
		}
	}
	for _, w := range sh.w {
		sh.sum += w
	}
	if sh.sum == 0 {
		for i := range sh.w {
			sh.w[i] = 1
		}
		sh.sum = float64(len(sh.w))
	}
}

func tieHash(key string, r int64, id string) uint64 {
	// FNV-1a: the same on every node (maphash seeds differ per process).
	h := uint64(14695981039346656037)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
		h ^= 0xff
		h *= 1099511628211
	}
	mix(key)
	for i := range 8 {
		h ^= uint64(byte(r >> (8 * i)))
		h *= 1099511628211
	}
	mix(id)
	return h
}
