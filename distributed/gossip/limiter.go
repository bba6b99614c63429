package gossip

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

var _ throttle.Limiter = (*Limiter)(nil)

// OverflowKey is the key under which a limiter whose table is full (the
// node's throttle.WithMaxKeys) decides and gossips the keys it has no room
// for: they share one bucket, limited and charged on every node like any
// key, rather than going unlimited or unshared. Stats.Overflow counts the
// decisions made under it.
const OverflowKey = "\x00overflow"

// Limiter is a keyed token bucket limiter whose buckets are charged for
// the hits of every node of the cluster: it decides locally, counts its
// admitted units per key, and debits the units its peers report. Create it
// with Node.NewLimiter (the zero value is not usable). It is safe for
// concurrent use.
type Limiter struct {
	node   *Node
	name   string
	rate   throttle.Rate
	burst  int
	bucket *gcra.Config // every key's bucket; each entry holds its key's state
	table  table
	dirty  dirty // entries changed since the last round took them
	retain int64 // rounds an idle counter is kept (and sent in full dumps)

	demand int64 // with the spend cap, the most demand a round counts (see demandRounds)
	closed atomic.Bool

	histMu   sync.Mutex // guards the fields below (Tick's)
	hist     []changes  // the entries each of the latest rounds took from dirty, oldest first
	histFrom int64      // hist holds every entry whose counters changed in this round or later
	seq      uint32     // the sequence number the next entry taken gets
	scans    int        // rounds that scanned the whole table for a peer's reports
	sweep    int        // the slot of the table the next expiry sweep starts at

	untracked untracked // peers' counters of keys the full table has no room for
}

// NewLimiter returns a limiter of buckets of burst tokens refilled at
// rate, gossiped under name (the same name, rate and burst on every node).
// Errors wrap throttle.ErrInvalid or throttle.ErrClosed.
func (n *Node) NewLimiter(name string, rate throttle.Rate, burst int) (*Limiter, error) {
	if name == "" || len(name) > maxName {
		return nil, fmt.Errorf("%w: limiter name must have 1 to %d bytes", throttle.ErrInvalid, maxName)
	}
	bucket, err := gcra.NewConfig(rate, burst)
	if err != nil {
		return nil, err
	}
	fill := int64(rate.Duration(int64(burst)))
	retain := max(int64(10), 2*(fill/n.interval+1))
	retain = min(retain, 1<<20)
	l := &Limiter{node: n, name: name, rate: rate, burst: burst, bucket: bucket, retain: retain}
	l.demand = demandCeiling(rate, burst, n.interval)
	l.table.init(n.settings.MaxKeys)
	l.dirty.init()
	l.histFrom = math.MinInt64
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, throttle.ErrClosed
	}
	if _, dup := n.limiters[name]; dup {
		return nil, fmt.Errorf("%w: limiter %q already exists on this node", throttle.ErrInvalid, name)
	}
	n.limiters[name] = l
	return l, nil
}

// Name returns the name the limiter gossips under.
func (l *Limiter) Name() string { return l.name }

// Tokens returns the whole tokens in key's bucket now, negative when
// peers' reports pushed it below empty: the bucket of OverflowKey for a
// key the full table has no room for.
func (l *Limiter) Tokens(key string) int64 {
	e := l.table.load(key)
	if e == nil && l.table.full() {
		e = l.table.load(OverflowKey)
	}
	if e == nil {
		return int64(l.burst)
	}
	return l.bucket.Tokens(l.node.clk.Now(), e.tat())
}

// Below calls f with each key whose bucket is below full now, and its
// whole tokens (negative in debt), until f returns false; the overflow
// key (OverflowKey) included. Keys added or dropped meanwhile may be
// seen or not. For saving a standalone daemon's state across a restart.
func (l *Limiter) Below(f func(key string, tokens int64) bool) {
	now := l.node.clk.Now()
	stop := false
	l.table.each(func(key string, e *entry) {
		if t := l.bucket.Tokens(now, e.tat()); !stop && t < int64(l.burst) {
			stop = !f(key, t)
		}
	})
}

// Hits returns the units this node admitted for key since its counter was
// created (counters of idle keys are dropped after a while).
func (l *Limiter) Hits(key string) int64 {
	if e := l.table.load(key); e != nil {
		return e.hits.Load()
	}
	return 0
}

// Close closes the limiter; later calls to Allow fail with
// throttle.ErrClosed. The node stops gossiping its counters. Idempotent.
func (l *Limiter) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	unregister(l.node, l.node.limiters, l.name, l)
	return nil
}

// Allow takes n tokens from key's local bucket if it holds them (and, with
// SpendCap, if they fit in this node's share for the current round), and
// counts them for the next report to the peers. It never blocks. A denial
// by the spend cap has the RetryAfter at which this node's share would
// admit the request if only time passed, the end of the round at most.
func (l *Limiter) Allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	if l.closed.Load() {
		return d, throttle.ErrClosed
	}
	if err := l.node.settings.CheckKey(key); err != nil {
		return d, err
	}
	if len(key) > MaxKeyLen {
		return d, fmt.Errorf("%w: key of %d bytes is longer than %d", throttle.ErrInvalid, len(key), MaxKeyLen)
	}
	if err := limiterkit.CheckN(n, l.burst); err != nil {
		return d, err
	}
	// The decision fills d in place (see limiterkit.Fill).
	if l.node.cfg.SpendCap && len(*l.node.members.Load()) > 1 {
		err = l.allowCapped(&d, key, n)
	} else {
		err = l.allow(&d, key, n)
	}
	return d, err
}

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

// allow is Allow without the spend cap. It pins nothing, and a denial
// writes nothing (but the round, once a round): a flood of requests for
// one key, denied, costs the cores that serve it no cache line moving
// between them, as with a plain bucket. An admission adds to hits; a
// round that drops the entry meanwhile either sees the decision and keeps
// the entry, or is seen by it (see kept), and the admission is counted on
// the key's new entry.
//
// A node without the cap reports what it admitted as its demand (it counts
// no unmet units): demand weighs the shares of peers that have the cap,
// and what such a node takes of the tokens is what its bucket admits, not
// what it is asked.
func (l *Limiter) allow(d *throttle.Decision, key string, n int) error {
	e, key := l.entry(key, false)
	now := l.node.clk.Now() // the decision's one clock reading
	t := l.node.tick.Load()
	e.touch(now, t, &l.dirty)
	if l.gated(d, e, now, n) {
		return nil
	}
	if err := l.bucket.Decide(d, &e.bucket, now, n); err != nil || !d.Allowed {
		return err
	}
	e.hits.Add(int64(n))
	if !l.table.kept(key, e) {
		// The units were taken from a bucket dropped meanwhile (a full
		// one, but for them): take them from the key's new bucket.
		e, _ = l.entry(key, true)
		e.touch(now, t, &l.dirty)
		e.bucket.Debit(now, l.bucket.Cost(int64(n)))
		e.hits.Add(int64(n))
		e.unpin()
	}
	return nil
}

// entry returns key's entry, pinned if pin, or the overflow key's when the
// table is full, and the key it belongs to.
func (l *Limiter) entry(key string, pin bool) (*entry, string) {
	for {
		var e *entry
		if pin {
			e = l.table.pin(key)
		} else {
			e = l.table.get(key)
		}
		if e != nil {
			return e, key
		}
		l.node.st.overflow.Add(1)
		key = OverflowKey // it always has room
	}
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
// record of the key is rec (nil if none): its demand per round lately;
// and what it spent in round r-1, which this node was charged.
func (l *Limiter) heard(rec *remoteRec, r int64) (w, spent float64) {
	if rec == nil || rec.r1 <= rec.r0 {
		return 0, 0
	}
	if rec.r1 >= uint64(r) {
		spent = float64(rec.h1 - rec.h0)
	}
	if rec.r1 >= uint64(r-1) {
		w = min(float64(rec.d1-rec.d0)/float64(rec.r1-rec.r0), float64(l.demand))
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

// entry is the gossip state of one key: this node's cumulative counters
// and what each peer last reported.
//
// It takes two cache lines, 128 bytes (a size the allocator aligns to
// 128): the first holds what every decision and look-up reads and hardly
// anything writes, the second what admissions (and pins) write. Cores
// admitting on one key then move one line of the entry between them, not
// two, and never the line they read.
type entry struct {
	// Read by decisions; written once a round at most (full: once a
	// round, or once each time the spend-capped share runs out).
	changed atomic.Int64 // round of the last Tick before the counters last changed
	born    atomic.Int64 // time of the first local request (ns): identifies the counter; 0 before
	// With the spend cap and full published, where unmet stops counting
	// in the round (see Limiter.unmetMax); stored under mu before full.
	unmetMax atomic.Int64
	remote   *remoteRec // the peer records, a list; guarded by mu
	key      string     // set before the entry is published, then constant
	hash     uint64     // of key, under the table's seed; likewise
	// With the spend cap: before this instant (ns) this node's share of
	// the round is spent, if nothing but time changes. Stored under mu
	// by a denial, cleared by whatever else changes the share: a peer's
	// record or debit (under mu, after the debit), a change of members, a
	// new round. A clock stepped back finds it ahead and keeps denying
	// single units until then, much as the bucket itself does: its TAT is
	// then as far ahead.
	full atomic.Int64

	// Written by admissions (and, with the spend cap, denials below the
	// demand ceiling).
	bucket gcra.State   // the key's token bucket
	hits   atomic.Int64 // units admitted here, cumulative
	unmet  atomic.Int64 // with the spend cap, units asked for here and not admitted, cumulative, up to each round's ceiling; demand is hits + unmet
	pin    atomic.Int32 // uses in progress (see table.pin); below dropped once dropped
	seq    uint32       // where the last round that took it put it (see changes); Tick's
	mu     sync.Mutex   // guards remote and the fields below
	round  int64        // with the spend cap, the round of spent
	spent  int64        // with the spend cap, units admitted here in round
	cap    *spending    // with the spend cap, the rest of its state
}

// remoteRec is what a peer reported of one key: one of the list of its
// entry's records, guarded by the entry's mu. A list, not a map: it takes
// 144 bytes a peer, where a map of two took 256 bytes and a record 112
// more for each; a cluster has few members.
type remoteRec struct {
	id     string     // the peer's ID
	next   *remoteRec // the entry's next record
	inc    uint64
	born   int64
	hits   uint64
	d0, d1 uint64 // cumulative demand at sender rounds r0 < r1
	h0, h1 uint64 // cumulative hits at the same rounds
	r0, r1 uint64
	seen   int64 // receiver round when the counter was last received

	allow      int64 // units the sender may still report (the cap)
	allowRound int64 // sender round allow was last refilled to
	credit     int64 // sender round of the last restart's burst added to allow
}

func (e *entry) unpin() { e.pin.Add(-1) }

// sharesChanged marks e's shares, if any, to be computed again, and clears
// full: a change to the peer records may grow this node's quota, and so
// may a debit (made before the call), by rounding. Called with e.mu held.
func (e *entry) sharesChanged() {
	if e.cap != nil {
		e.cap.shares.members = nil
	}
	e.full.Store(0)
}

// pinned pins e unless it was dropped.
func (e *entry) pinned() bool {
	if e.pin.Add(1) > 0 {
		return true
	}
	e.pin.Add(-1)
	return false
}

// touch notes a decision at now in round t: the counter is born at its
// first, and changed in t.
// The first to move changed forward to t adds e to d, the changes the
// next round looks at.
func (e *entry) touch(now, t int64, d *dirty) {
	if e.born.Load() == 0 {
		e.born.CompareAndSwap(0, now)
	}
	if c := e.changed.Load(); c < t && e.changed.CompareAndSwap(c, t) {
		d.add(e)
	}
}

// tat returns the TAT of e's bucket.
func (e *entry) tat() int64 {
	tat, _ := e.bucket.Load()
	return tat
}

// noRemote reports whether e keeps no peer records.
func (e *entry) noRemote() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.remote == nil
}

// peerRec returns the record of the peer with ID id, nil if none. Called
// with e.mu held.
func (e *entry) peerRec(id string) *remoteRec {
	for r := e.remote; r != nil; r = r.next {
		if r.id == id {
			return r
		}
	}
	return nil
}

// setPeerRec makes nr the record of its peer in place of old, the peer's
// record (nil if none), and returns it. Called with e.mu held.
func (e *entry) setPeerRec(old, nr *remoteRec) *remoteRec {
	if old != nil {
		nr.next = old.next
		*old = *nr
		return old
	}
	nr.next = e.remote
	e.remote = nr
	return nr
}

// pruneRemote drops peer records not received since round before (their
// sender has dropped them, or left) and reports whether none are left.
func (e *entry) pruneRemote(before int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sharesChanged()
	for p := &e.remote; *p != nil; {
		if (*p).seen < before {
			*p = (*p).next
		} else {
			p = &(*p).next
		}
	}
	return e.remote == nil
}

// pin returns key's entry, created if absent, pinned so that it is not
// dropped until unpin. It returns nil when the table is full.
func (t *table) pin(key string) *entry {
	for {
		e := t.load(key)
		if e == nil {
			if t.full() && key != OverflowKey {
				return nil // the overflow key always has room
			}
			t.mu.Lock()
			if e = t.load(key); e == nil {
				e = t.insert(key)
				if key != OverflowKey {
					t.n.Add(1) // the overflow key is beyond the count
				}
			}
			t.mu.Unlock()
		}
		if e.pinned() {
			return e
		}
	}
}

// kept reports whether e, which a decision touched (see entry.touch) and
// counted on, is kept: not dropped, or dropped and put back by a round that
// saw the touch. It is false when e was dropped by a round that did not
// see it, and the counts are lost with it. Touch first, then read pin;
// drop writes pin first, then reads changed: one of the two sees the
// other's write.
func (t *table) kept(key string, e *entry) bool {
	for e.pin.Load() < 0 {
		if t.load(key) != e {
			return false
		}
		runtime.Gosched() // the drop is deciding
	}
	return true
}

// get returns key's entry, created if absent, not pinned: it may be
// dropped at any time. It returns nil when the table is full.
func (t *table) get(key string) *entry {
	if e := t.load(key); e != nil {
		return e
	}
	e := t.pin(key)
	if e != nil {
		e.unpin()
	}
	return e
}

// dropped is an entry's pin count once dropped: a pin is one add, not a
// compare-and-swap loop, so that a hot key's decisions do not retry each
// other's pins, and the pins that find a dropped entry (and take their add
// back) cannot bring it back to zero.
const dropped = math.MinInt32 / 2

// drop removes e if no decision holds it and, once none can pin it, still
// it still is.
func (t *table) drop(key string, e *entry, still func() bool) {
	if !e.pin.CompareAndSwap(0, dropped) {
		return
	}
	if !still() {
		e.pin.Add(-dropped) // back to the pins that failed meanwhile and will take theirs back
		return
	}
	t.mu.Lock()
	if t.remove(e) && key != OverflowKey {
		t.n.Add(-1)
	}
	t.mu.Unlock()
}
