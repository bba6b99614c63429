package gossip

import (
	"math"
	"time"
)

// allowance returns the most units a node could have admitted for one
// key over rounds rounds: a full burst plus the refill, plus two rounds of
// refill for clock skew and rounding.
func (l *Limiter) allowance(rounds int64) int64 {
	return satAdd(int64(l.burst)+1, l.refill(max(rounds, 0)+2))
}

// refill returns the tokens a bucket gains over rounds rounds (none for
// rounds <= 0), saturating.
func (l *Limiter) refill(rounds int64) int64 {
	if rounds <= 0 {
		return 0
	}
	return l.rate.Events(time.Duration(min(rounds, math.MaxInt64/l.node.interval) * l.node.interval))
}

// satAdd returns a+b for non-negative a and b, at most math.MaxInt64.
func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// available returns what rec's sender may still report at its round sr:
// what it had left at its round rec.allowRound plus the refill since,
// however long it was unheard (a peer cut off for a minute may report a
// minute of hits at once). Called with the entry's mu held.
func (l *Limiter) available(rec *remoteRec, sr int64) int64 {
	return satAdd(rec.allow, l.refill(sr-rec.allowRound))
}

// senderRound returns the round of m's sender, not ahead of this node's
// round at now (its clock's, which a round run late, t, may lag: the
// cap would discard honest hits until the round caught up) by more than
// one.
func (l *Limiter) senderRound(m *message, t, now int64) int64 {
	return min(int64(m.round), max(t, now/l.node.interval)+1)
}

// refillTo adds to rec's allowance the whole tokens its sender's bucket
// gained from round rec.allowRound to sr, and moves allowRound forward by
// the rounds those took, not to sr: the fraction of a token the rounds
// left bring counts later. (Moved to sr at every report, a limit slower
// than a token a round never refilled the allowance.) Called with the
// entry's mu held.
func (l *Limiter) refillTo(rec *remoteRec, sr int64) {
	add := l.refill(sr - rec.allowRound)
	if add <= 0 {
		return
	}
	rec.allow = satAdd(rec.allow, add)
	d := int64(l.rate.Duration(add))
	used := d / l.node.interval
	if d%l.node.interval != 0 {
		used++
	}
	rec.allowRound = min(rec.allowRound+used, sr)
}

// replaced returns the allowance of a counter of rec's sender that
// replaces rec's at the sender's round sr: born at born, in a new
// incarnation of the sender if restarted. The allowance is per peer and
// key, not per counter: a new counter starts from what the old one had
// left, refilled, never above what a counter born at born could have
// admitted (fresh, see applyReport); a restart adds a full burst, the
// fresh bucket the new life starts with, at most once per retention, so
// that a peer minting counters or incarnations gains nothing by it beyond
// a burst per retention. Called with the entry's mu held.
func (l *Limiter) replaced(rec *remoteRec, sr int64, restarted bool, fresh int64) (allow, credit int64) {
	allow, credit = l.available(rec, sr), rec.credit
	if restarted && sr-rec.credit >= l.retain {
		allow, credit = satAdd(allow, int64(l.burst)+1), sr
	}
	return min(allow, fresh), credit
}

// applyReport debits the hits a peer reported and returns how many units
// it debited, and how many it did not because they exceed what the peer
// could have admitted. t is the receiver's current round.
//
// The cap is a token bucket per (key, peer) in the peer's rounds, which
// may not run ahead of the receiver's: what a peer reports for a key
// grows by at most burst + rate x the time since its last report (plus
// some slack), however long that was, so a peer that holds the secret
// cannot charge more than it could have admitted itself, and honest hits
// reported late, after a partition, are all charged.
func (l *Limiter) applyReport(m *message, acceptFrom, t int64) (total, capped int64) {
	now := l.node.clk.Now()
	sr := l.senderRound(m, t, now)
	for _, x := range m.reports {
		e := l.table.pin(x.key)
		if e == nil {
			l.node.st.overflow.Add(1)
			debited, c := l.chargeUntracked(m, x, acceptFrom, sr, now)
			total, capped = total+debited, satAdd(capped, c)
			continue
		}
		e.mu.Lock()
		rec, delta := l.record(e, m, x, acceptFrom, t, sr)
		debited, c := l.debit(e, rec, delta, now)
		e.mu.Unlock()
		e.unpin()
		total, capped = total+debited, satAdd(capped, c)
	}
	return total, capped
}

// record updates e's record of m's sender with x, its report of e's key,
// and returns the record and the units the report adds to what the
// sender had reported. t is the receiver's round and sr the sender's
// (see senderRound). Called with e.mu held.
func (l *Limiter) record(e *entry, m *message, x reportEntry, acceptFrom, t, sr int64) (rec *remoteRec, delta int64) {
	rec = e.peerRec(m.sender)
	if rec != nil && m.incarnation > rec.inc && x.born == rec.born && x.hits >= rec.hits {
		// The same counter, its sender having moved past an
		// earlier life (see Node.handle).
		rec.inc = m.incarnation
	}
	switch {
	case rec == nil || m.incarnation != rec.inc || x.born > rec.born:
		// A counter we have not seen (the node checked that the
		// incarnation is the peer's current one): all of it is news
		// if it was born after we started listening to the peer;
		// otherwise it is history (covered by the state sync) and
		// becomes the baseline.
		nr := &remoteRec{id: m.sender, inc: m.incarnation, born: x.born, hits: x.hits, d1: x.demand, r1: m.round, r0: m.round,
			d0: x.demand, h0: x.hits, h1: x.hits, seen: t, allowRound: sr, credit: math.MinInt64 / 2}
		fresh := l.allowance(0)
		if x.born >= acceptFrom {
			delta = int64(x.hits)
			nr.d0, nr.h0, nr.r0 = 0, 0, m.round-1
			fresh = l.allowance(sr - max(x.born, acceptFrom)/l.node.interval)
		}
		nr.allow = fresh
		if rec != nil {
			nr.allow, nr.credit = l.replaced(rec, sr, m.incarnation != rec.inc, fresh)
		}
		return e.setPeerRec(rec, nr), delta
	case x.born < rec.born:
		// An older counter, delayed: ignore.
	default:
		rec.seen = t
		l.refillTo(rec, sr)
		if x.hits > rec.hits {
			delta = int64(x.hits - rec.hits)
			rec.hits = x.hits
		}
		if m.round > rec.r1 && x.demand >= rec.d1 && x.hits >= rec.h1 {
			rec.d0, rec.h0, rec.r0 = rec.d1, rec.h1, rec.r1
			rec.d1, rec.h1, rec.r1 = x.demand, x.hits, m.round
		}
	}
	return rec, delta
}

// debit debits from e's bucket at now the delta units its record rec
// adds, up to what rec's sender may still report, and returns the units
// debited and those capped. Called with e.mu held.
func (l *Limiter) debit(e *entry, rec *remoteRec, delta, now int64) (debited, capped int64) {
	if delta > 0 {
		if delta > rec.allow {
			capped = delta - rec.allow
			delta = rec.allow
		}
		rec.allow -= delta
		e.bucket.Debit(now, l.bucket.Cost(delta))
		debited = delta
	}
	// What is left carries over to later rounds up to what a full
	// bucket and the slack allow.
	rec.allow = min(rec.allow, l.allowance(0))
	e.sharesChanged() // after the debit: see entry.full
	return debited, capped
}

// applyState lowers each bucket to the level a peer reported, if it is
// lower, less this node's own hits the peer had not counted yet: how a
// node that joined or restarted catches up.
//
// The level includes the sender's own hits up to the state's counter
// snapshot: they are recorded as delivered, so that the sender's next
// report of that counter charges only the hits after them (else hits made
// just before this node listened, which it takes as news, would be charged
// twice when the state arrives first). t is the receiver's current round.
//
// A level is taken no lower than the reports of every member could take
// a full bucket, each capped at what its sender could have admitted (see
// applyReport): a peer that holds the secret cannot put a key in debt for
// longer by sending a level than by sending reports. It returns how many
// units of the levels it did not debit for that reason.
func (l *Limiter) applyState(m *message, t int64) (capped int64) {
	now := l.node.clk.Now()
	floor := int64(math.MinInt64 / 4) // far from overflow, past any bucket's debt
	if k, a := l.node.size.Load(), l.allowance(l.retain); a <= -floor/k {
		floor = -k * a
	}
	for _, s := range m.states {
		if e := l.table.pin(s.key); e == nil {
			l.node.st.overflow.Add(1)
		} else {
			if s.tokens < floor {
				capped = satAdd(capped, min(floor-s.tokens, math.MaxInt64))
			}
			e.mu.Lock()
			target := max(s.tokens, floor) - max(e.hits.Load()-int64(s.yours), 0)
			if cur := l.bucket.Tokens(now, e.tat()); target < cur {
				e.bucket.Debit(now, l.bucket.Cost(cur-target))
				e.sharesChanged() // after the debit: see entry.full
			}
			e.mu.Unlock()
			e.unpin()
		}
		if s.born != 0 {
			l.delivered(m, s, t)
		}
	}
	return capped
}

// delivered records that the sender's counter s.born has delivered at
// least s.mine hits (they are in a level this node took).
func (l *Limiter) delivered(m *message, s stateEntry, t int64) {
	e := l.table.pin(s.key)
	if e == nil {
		return // table full: the key is under the overflow key
	}
	defer e.unpin()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sharesChanged()
	switch rec := e.peerRec(m.sender); {
	case rec == nil || m.incarnation != rec.inc || s.born > rec.born:
		sr := l.senderRound(m, t, l.node.clk.Now())
		nr := &remoteRec{id: m.sender, inc: m.incarnation, born: s.born, hits: s.mine,
			h0: s.mine, h1: s.mine, r0: m.round, r1: m.round, seen: t, allow: l.allowance(0), allowRound: sr, credit: math.MinInt64 / 2}
		if rec != nil {
			nr.allow, nr.credit = l.replaced(rec, sr, m.incarnation != rec.inc, nr.allow)
		}
		e.setPeerRec(rec, nr)
	case s.born == rec.born && s.mine > rec.hits:
		rec.hits = s.mine
	}
}
