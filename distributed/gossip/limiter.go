package gossip

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

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
// Before it returns, it applies the reports and states its peers sent for
// name before it existed (the latest 64 rounds' at most, within bounds on
// memory), so that a limit rolled out node by node does not start full on
// the later nodes: what the earlier ones took under it is charged first.
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
	if n.closed {
		n.mu.Unlock()
		return nil, throttle.ErrClosed
	}
	if _, dup := n.limiters[name]; dup {
		n.mu.Unlock()
		return nil, fmt.Errorf("%w: limiter %q already exists on this node", throttle.ErrInvalid, name)
	}
	early := n.takeEarly(l)
	n.limiters[name] = l
	n.mu.Unlock()
	n.applyEarly(l, early)
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
	if len(key) > maxKeyLen {
		return d, fmt.Errorf("%w: key of %d bytes is longer than %d", throttle.ErrInvalid, len(key), maxKeyLen)
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
