package gossip

import (
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// allowCapped is Allow with the spend cap.
//
// A single unit asked for while the entry says that this node's share of
// the round is spent (see entry.full) is denied without a lock, and the
// denial writes only the unmet counter: a flood on one key, denied, moves
// one cache line between the cores that serve it. Any other decision
// locks the entry: the share is decided on the round's counters, which
// the decision then updates.
func (l *Limiter) allowCapped(d *throttle.Decision, asked string, n int) error {
	e, key := l.entry(asked, false)
	now := l.node.clk.Now() // the decision's one clock reading
	t := l.node.tick.Load()
	e.touch(now, t, &l.dirty)
	if l.gated(d, e, now, n) {
		return nil
	}
	if u := e.full.Load(); n == 1 && now < u {
		limiterkit.Fill(d, false, int64(l.burst), 0, u-now, untilFull(now, e.tat()))
		e.ask(1, e.unmetMax.Load())
		if !l.table.kept(key, e) {
			e, _ = l.entry(key, true)
			e.touch(now, t, &l.dirty)
			e.unmet.Add(1)
			e.unpin()
		}
		return nil
	}
	e, key = l.lock(e, asked, key, now, t)
	defer e.mu.Unlock()
	r := now / l.node.interval
	e.begin(r)
	c := l.bucket
	tat := e.tat()
	mp := l.node.members.Load()
	sh := l.shares(e, mp, r)
	total := c.Tokens(now, tat) + e.spent
	quota := l.quota(sh, key, r, total)
	if need := e.spent + int64(n); need > quota {
		u := l.until(sh, c, key, r, now, tat, e.spent, need)
		limiterkit.Fill(d, false, int64(l.burst), 0, u-now, untilFull(now, tat))
		if quota <= e.spent && !sh.pending {
			// Not even one unit fits until u1: publish it for the
			// lock-free denials, unless the members changed meanwhile
			// (their change clears every entry's full after it
			// publishes the new list).
			u1 := u
			if n > 1 {
				u1 = l.until(sh, c, key, r, now, tat, e.spent, e.spent+1)
			}
			e.unmetMax.Store(l.unmetMax(e))
			e.full.Store(u1)
			if l.node.members.Load() != mp {
				e.full.Store(0)
			}
		}
		e.ask(int64(n), l.unmetMax(e))
		return nil
	}
	err := c.Decide(d, &e.bucket, now, n)
	if err != nil || !d.Allowed {
		e.ask(int64(n), l.unmetMax(e))
		return err
	}
	e.hits.Add(int64(n))
	e.spent += int64(n)
	d.Remaining = int(min(int64(d.Remaining), max(quota-e.spent, 0)))
	return nil
}

// lock locks e, the entry of asked (key's when the table is full) that a
// decision at now in round t touched, and returns it with its key; or,
// if a drop removed e meanwhile, the key's new entry, touched and locked.
// A locked entry not seen dropped is not dropped until it is unlocked:
// drop marks the pin before it reads the round the entry last changed in,
// and the decision touched the entry before it reads the pin, so a drop
// that would go ahead is seen here, and any other sees the touch and
// gives up (see table.kept). The lock holds no pin, which would be two
// more atomic additions per decision.
func (l *Limiter) lock(e *entry, asked, key string, now, t int64) (*entry, string) {
	for {
		e.mu.Lock()
		if e.pin.Load() >= 0 {
			return e, key
		}
		e.mu.Unlock() // a drop deciding may need it (entry.noRemote)
		if l.table.load(key) == e {
			runtime.Gosched() // the drop is deciding
			continue
		}
		e, key = l.entry(asked, false)
		e.touch(now, t, &l.dirty)
	}
}

// untilFull is how long (ns) a bucket whose TAT is tat takes to be full
// at now: the ResetAfter of a decision.
func untilFull(now, tat int64) int64 {
	if tat <= now {
		return 0
	}
	return tat - now
}

// quota returns this node's spend cap for key in round r, given sh, the
// round's shares, and total, the tokens left for the round as this node
// sees them (its bucket's plus what it spent in the round). Shares are
// proportional to the demand each member reported for the previous round
// (equal when nobody reported any), and rounded by the largest-remainder
// method with ties broken by a hash of (key, round, node) that every node
// computes alike, so that with equal views the quotas of all nodes add up
// to exactly the tokens left.
//
// A peer whose report for the last round has not arrived yet (in flight
// at the start of a round, or lost) has spent tokens this node has not
// been charged for: they are estimated at the peer's recent hit rate and
// set aside (sh.held). Called with e.mu held.
func (l *Limiter) quota(sh *shares, key string, r, total int64) int64 {
	// Admissions leave the total as it is (the bucket loses what the
	// round's spending gains), so the last quota is often the one asked.
	if total != sh.total {
		sh.total, sh.quota = total, l.quotaOf(sh, key, r, total)
	}
	return sh.quota
}

// quotaOf is quota, computed afresh.
func (l *Limiter) quotaOf(sh *shares, key string, r, total int64) int64 {
	members := *sh.members
	if len(members) == 1 {
		return max(total, 0)
	}
	total -= sh.held
	if total <= 0 {
		return 0
	}
	var buf [16]portion
	qs := buf[:0]
	var big *[]portion
	if len(members) > len(buf) {
		big = bigPortions.Get().(*[]portion)
		if cap(*big) < len(members) {
			*big = make([]portion, len(members))
		}
		qs = *big
	}
	qs = qs[:len(members)]
	var given int64
	for i := range qs {
		x := sh.w[i] / sh.sum * float64(total)
		qs[i].whole = int64(x)
		qs[i].frac = x - float64(qs[i].whole)
		given += qs[i].whole
	}
	self := sh.self
	mine := qs[self].whole
	if left := total - given; left > 0 {
		me := qs[self]
		rank := int64(0) // members ahead of this node for a leftover token
		var myTie uint64 // hashed on the first tie only: ties need it
		hashed := false
		for i, o := range qs {
			if o.frac > me.frac {
				rank++
			} else if o.frac == me.frac && i != self {
				if !hashed {
					myTie, hashed = tieHash(key, r, members[self]), true
				}
				if tieHash(key, r, members[i]) < myTie {
					rank++
				}
			}
		}
		if rank < left {
			mine++
		}
	}
	if big != nil {
		bigPortions.Put(big)
	}
	return mine
}

// bigPortions holds quota's portions for clusters of more members than
// fit on its stack.
var bigPortions = sync.Pool{New: func() any { return new([]portion) }}

// maxSteps bounds the totals until tries.
const maxSteps = 64

// until returns the first instant, from now to the end of round r, at
// which this node's quota reaches need units if only time passes: the
// bucket, whose TAT is tat, refills, and nothing else changes (spent and
// the shares stay). It is the round's end when that never happens within
// the round. Quotas do not always grow with the total (the rounding
// can give this node a leftover unit at one total and not at the next),
// so it tries the totals one by one, from the first whose share (before
// rounding) could reach need, at most maxSteps of them: past those it
// returns the instant the last one tried is reached, a lower bound. Called
// with e.mu held.
func (l *Limiter) until(sh *shares, c *gcra.Config, key string, r, now, tat, spent, need int64) int64 {
	end := (r + 1) * l.node.interval
	total := c.Tokens(now, tat) + spent
	if sh.w[sh.self] == 0 {
		// A member with no weight gets no unit, not even a leftover one:
		// the leftover units go to members with a larger fraction.
		return end
	}
	// A total whose share is below need-1 rounds down to a quota below
	// need even with a leftover unit: skip them.
	f := sh.w[sh.self] / sh.sum
	from := total + 1
	if skip := sh.held + int64(float64(need-1)/f) - 2; skip > from && f*float64(skip-1-sh.held) < float64(need-1) {
		from = skip
	}
	at := from
	for i := 0; i < maxSteps; i, at = i+1, at+1 {
		if at-spent > int64(c.Burst) {
			return end // the bucket never holds that many
		}
		if l.quotaOf(sh, key, r, at) >= need {
			break
		}
	}
	return min(c.When(now, tat, at-spent), end)
}

// demandRounds is how many rounds' worth of tokens a round's demand
// counts at most, per node and key: see demandCeiling.
const demandRounds = 16

// demandCeiling returns the most units a round's demand counts, per node
// and key: demandRounds times what the whole cluster could admit for the
// key in a round (a full bucket and a round's refill). Demand beyond that
// cannot be met anyway, and counting it would only let a flooded node
// take a larger share from nodes flooded less: a node (or a peer's
// report) asking more weighs as much as the ceiling. It also lets a
// denial in such a flood write nothing (see allowCapped).
func demandCeiling(rate throttle.Rate, burst int, interval int64) int64 {
	const most = math.MaxInt64 / 4 // keeps base + ceiling far from overflow
	round := min(int64(burst)+rate.Events(time.Duration(interval)), most/demandRounds)
	return demandRounds * round
}

// unmetMax is the value of e's unmet counter at which e's round has
// counted l.demand units of demand. Called with e.mu held, after e.begin.
func (l *Limiter) unmetMax(e *entry) int64 {
	return e.cap.base + l.demand - e.hits.Load()
}

// ask counts n units asked for and not admitted, as long as the unmet
// counter stays below limit: once it is there, a denial reads the
// counter and writes nothing.
func (e *entry) ask(n, limit int64) {
	for {
		u := e.unmet.Load()
		if u >= limit || e.unmet.CompareAndSwap(u, min(u+n, limit)) {
			return
		}
	}
}

// spending is the part of an entry's spend-cap state that changes once a
// round at most, made by its first locked capped decision and guarded by
// the entry's mutex. (What admissions write, the round and what it spent,
// is in the entry, on the cache line the key's admissions write anyway.)
type spending struct {
	base      int64 // demand here (hits + unmet) when e.round began
	prev      int64 // units asked for here in e.round-1
	prevSpent int64 // units admitted here in e.round-1
	shares    shares
	last      struct { // the shares of the round before shares.round, as last computed in it
		round int64
		of    *[]string
		w     []float64
		sum   float64
	}
	waiting []*peer // the pending peers of shares
}

// pendingRounds is how many rounds a peer may go unheard and still be
// pending (see Limiter.shares): a peer unheard for longer is estimated at
// its recent hit rate only, until it is dead (Node.deadAfter).
const pendingRounds = 3

// arrived reports whether a peer pending in the shares of round r has
// been heard for it since. Called with the entry's mu held.
func (c *spending) arrived(r int64) bool {
	for _, p := range c.waiting {
		if int64(p.done.Load()) >= r {
			return true
		}
	}
	return false
}

// begin makes r e's spend-cap round, if it is not yet: a round's demand
// is what the demand counters gained during it, lock-free denials
// included. Called with e.mu held.
func (e *entry) begin(r int64) {
	if e.cap == nil {
		e.cap = new(spending)
		e.round = math.MinInt64
	}
	if e.round != r {
		e.full.Store(0) // said of the old round (a clock stepped back finds it ahead)
		demand := e.hits.Load() + e.unmet.Load()
		e.cap.prev, e.cap.prevSpent = 0, 0
		if e.round == r-1 {
			e.cap.prev = demand - e.cap.base
			e.cap.prevSpent = e.spent
		}
		e.round, e.spent, e.cap.base = r, 0, demand
	}
}
