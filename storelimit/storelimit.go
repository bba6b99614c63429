// Package storelimit is a keyed limiter whose state lives in a
// Store (a SQL table, a Memcached, the in-memory Memory) and whose
// decisions are an Algorithm's pure step run in Go: one implementation of
// the read-decide-compare-and-swap loop for every store and every
// algorithm whose state fits one int64 (tokenbucket, leakybucket,
// fixedwindow, slidingwindow). A new backend implements two methods of
// Store and inherits the algorithms, their conformance suite and
// their differential traces.
//
// # Guarantees
//
// A decision's state change is one compare-and-swap on the key's stored
// state, so on a Store that is atomic per key (the contract of
// Store) the Limiter decides exactly as the in-process limiter
// of the same Algorithm on the same trace and clock, however many
// goroutines and processes share the store: nothing admitted is lost or
// counted twice. A denial reads once and writes nothing; an admission
// reads once and writes once, and reads and tries again only when another
// writer changed the key in between (at most 1000 tries, then an
// error wrapping throttle.ErrUnavailable).
//
// On a LoadingStore the Limiter first decides on the state it
// last saw of the key (kept in a two-way table of 4096 guesses by a hash
// of the key, 96 KiB, with the expiry of the states it wrote): an
// admission whose guess holds is then one call to the store, and a wrong
// guess costs nothing but the call that corrects it, since the swap fails
// and returns the state. A denial is decided on a state read from the
// store in the same call, as above.
//
// # Hot keys
//
// Concurrent calls of one Limiter on one key are decided in rounds: while
// one call decides with the store, the calls for the same key that arrive
// wait, and the next round decides all of them in their order on one
// state (at the latest instant any of them read), with one
// read-decide-swap. Decisions are those of the in-process limiter on that
// trace, so exactness holds as above; a hot key costs the store one round
// trip or two per round rather than per call, and the calls of one
// process never race each other's compare-and-swap. A call whose context
// ends while it waits leaves at once and is not decided; one whose
// context ends while its round is in flight fails, its units possibly
// charged (as when a store's reply is lost). A round runs until the
// latest deadline of the calls waiting when the previous one ended (those
// that join it later and have a later deadline fail at that one, never
// after their own), whether or not the caller leading it cancels.
//
// # Batches
//
// Over a BatchStore (pglimit's), the swaps of one Limiter's decisions on
// different keys go to the store together once 16 calls of it are there:
// the swaps that arrive then wait, and when a call returns they go as one
// batch (for pglimit one statement, one commit), led by the one with the
// latest deadline, as a round is. A swap that finds fewer than 16 calls
// in flight goes at once, so a process with few concurrent callers waits
// for nothing more. Each key keeps its compare-and-swap (one that fails
// returns the key's state, and its decisions are made again on it), so
// exactness holds as above, and a key the store fails, or whose state is
// corrupt, fails its own callers only. A swap waiting for a batch leaves
// at its caller's deadline; a batch runs until its leader's deadline
// (the latest of those waiting when it formed), as a round does.
//
// # Leasing
//
// A Limiter made by NewLeasing takes batches of units of a key from the
// store (one read-decide-swap each, charged there) and spends them
// locally, lock-free, for a key hotter than the store's commits: see
// NewLeasing for the bound (never more than the Algorithm admits over the
// store, moved later by at most the lease's age) and what it loses
// (under-admission only).
//
// # Timeouts
//
// Over a Store with a Timeout() time.Duration method (pglimit's), each
// decision is bounded by the store's timeout as a whole, however many
// calls to the store it takes (a key contended by other processes): it
// then fails with an error wrapping throttle.ErrUnavailable and
// context.DeadlineExceeded.
//
// Each process decides with its own clock, passed to the store with every
// call (a store reads no clock), so processes sharing a store need
// synchronised clocks: a process whose clock is behind sees keys as more
// used, one whose clock is ahead by δ as less used, by what the limit
// refills in δ. A token bucket's key then admits at most rate·δ more over
// any interval, and a clock stepped back re-admits nothing (the bound is
// the registry's store-clocks row, docs/guarantees.md).
//
// Every failure of the store is returned wrapping throttle.ErrUnavailable
// (and the store's error), so failsafe decides what a missing store means.
// A write whose outcome the store cannot know (the connection lost after
// the server committed) is such a failure too: its units may have been
// charged though the call was not admitted, never the other way round.
package storelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/lease"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// maxAttempts bounds the compare-and-swap attempts of one decision: each
// failed attempt means another writer's decision on the key succeeded.
const maxAttempts = 1000

// Limiter decides with an Algorithm over the states of a Store, one per
// key. It is safe for concurrent use and holds nothing per key itself but
// guesses, over a LoadingStore, and leased units (NewLeasing). The zero
// value is not usable: Allow fails with an error wrapping
// throttle.ErrInvalid; create it with New or NewLeasing.
type Limiter struct {
	s     Store
	ls    LoadingStore // s, when it is one
	bs    BatchStore   // s, when it is one
	batch batcher      // with bs
	g     *guesses     // with ls
	a     Algorithm
	fresh int64
	limit int
	clk   clock.Source
	keys  limiterkit.Settings
	// timeout bounds each decision as a whole: the Store's Timeout.
	timeout time.Duration
	seed    maphash.Seed
	shards  [shardCount]shard // the keys with a round in flight
	reqs    sync.Pool         // of *request, reused across calls
	lease   *lease.Leaser     // with NewLeasing
	closed  atomic.Bool
}

// timeouter is a Store whose calls are bounded by a timeout (pglimit's):
// a Limiter over it bounds each decision as a whole by Timeout, however
// many calls to the store it takes, so that a contended key costs the
// caller at most the store's timeout.
type timeouter interface {
	Timeout() time.Duration
}

// New returns a limiter deciding with a over the states kept in s. The
// Options it reads are WithClock and WithMaxKeyLen; any other is refused
// (a store bounds its own keys and sweeps its own expired states). Errors
// wrap throttle.ErrInvalid.
func New(s Store, a Algorithm, opts ...throttle.Option) (*Limiter, error) {
	if s == nil || a == nil {
		return nil, fmt.Errorf("%w: storelimit.New needs a Store and an Algorithm", throttle.ErrInvalid)
	}
	set, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	if set.MaxKeys != limiterkit.DefaultMaxKeys || set.SweepInterval != 0 {
		return nil, fmt.Errorf("%w: storelimit reads only WithClock and WithMaxKeyLen", throttle.ErrInvalid)
	}
	limit := a.Quota().Limit
	if limit <= 0 {
		return nil, fmt.Errorf("%w: storelimit.New: the Algorithm has no limit (a zero Algorithm?)", throttle.ErrInvalid)
	}
	l := &Limiter{s: s, a: a, fresh: a.Fresh(), limit: limit, clk: clock.New(set.Clock), keys: set, seed: maphash.MakeSeed()}
	l.reqs.New = newRequest
	if ls, ok := s.(LoadingStore); ok {
		l.ls, l.g = ls, new(guesses)
	}
	if bs, ok := s.(BatchStore); ok {
		l.bs = bs
		l.batch.slots, l.batch.ops.New = batchSlots, newSwapOp
	}
	if t, ok := s.(timeouter); ok {
		l.timeout = max(t.Timeout(), 0)
	}
	return l, nil
}

// Allow decides n units for key now. It reads the key's state from the
// store, decides with the Algorithm and, when it admits, stores the next
// state if the key's state is still the one read, else reads and decides
// again. Concurrent calls of this Limiter on one key are decided together
// (see "Hot keys" in the package documentation). Errors wrap
// throttle.ErrInvalid (a bad key or n, a zero Limiter, a stored state no
// Algorithm of this limit wrote), throttle.ErrExceedsLimit (n above the
// limit) or throttle.ErrUnavailable (the store failed, the call ran out
// of time, or the key stayed contended for 1000 tries).
func (l *Limiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if l == nil || l.s == nil {
		return throttle.Decision{}, fmt.Errorf("%w: zero storelimit.Limiter: use New", throttle.ErrInvalid)
	}
	if l.closed.Load() {
		return throttle.Decision{}, fmt.Errorf("%w: storelimit.Limiter", throttle.ErrClosed)
	}
	if err := l.keys.CheckKey(key); err != nil {
		return throttle.Decision{}, err
	}
	if err := limiterkit.CheckN(n, l.limit); err != nil {
		return throttle.Decision{}, err
	}
	if l.lease != nil { // a Take is bounded by the timeout; a spend is local
		return l.lease.Allow(ctx, key, n, l.clk.Now())
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	r := l.reqs.Get().(*request)
	r.n, r.now, r.d, r.err = n, l.clk.Now(), throttle.Decision{}, nil
	r.deadline, _ = ctx.Deadline()
	r.state.Store(waiting)
	h := maphash.String(l.seed, key)
	sh := &l.shards[h%shardCount]
	if sh.join(key, r) {
		if d, left, err := l.await(ctx, sh, key, h, r); left {
			return d, err // r may still be written by a round: not reused
		}
	} else {
		r.state.Store(leading)
		r.one[0] = r
		l.lead(ctx, sh, key, h, r, r.one[:1])
		r.one[0] = nil
	}
	d, err := r.d, r.err
	l.reqs.Put(r)
	return d, err
}

var errContended = fmt.Errorf("%w: storelimit: key still contended after %d attempts", throttle.ErrUnavailable, maxAttempts)

// decide decides the requests of round, in order, on key's state at now,
// and stores the state they leave if the key's state is still the one
// they were decided on, else decides them again on the key's new state.
func (l *Limiter) decide(ctx context.Context, key string, h uint64, round []*request, now int64) {
	err := l.update(ctx, key, h, now, func(old int64) (int64, time.Duration, bool) {
		next, reset, admitted := l.step(round, old, now)
		return next, reset, admitted > 0
	})
	if err != nil {
		fail(round, err)
	}
}

// update changes key's state at now by step, which returns the next state,
// its time to reset and whether it changes anything: it swaps the state
// step leaves in if the key's state is still the one step saw, else runs
// step again on the key's new state. On a LoadingStore it starts from the
// state last seen of key, and swaps and learns the state in one call; a
// step that changes nothing is run again on the state read from the
// store. It returns an error wrapping throttle.ErrUnavailable when the
// store fails or the key stays contended.
func (l *Limiter) update(ctx context.Context, key string, h uint64, now int64, step func(old int64) (next int64, reset time.Duration, change bool)) error {
	var sl slot
	var old int64
	if l.ls != nil {
		sl, old = l.g.get(h, now)
	}
	read := false // old is the store's state, read in this call
	for range maxAttempts {
		if !read && l.ls == nil {
			if err := l.load(ctx, key, now, &old); err != nil {
				return err
			}
			read = true
		}
		next, reset, change := step(old)
		if !change && !read {
			if err := l.load(ctx, key, now, &old); err != nil {
				return err
			}
			read = true
			l.g.put(sl, old, math.MaxInt64)
			continue
		}
		if !change {
			return nil
		}
		exp := expires(now, int64(reset))
		cur, ok, err := l.swap(ctx, key, h, old, next, now, exp)
		if err != nil {
			return unavailable(err)
		}
		if ok {
			l.g.put(sl, next, exp)
			return nil
		}
		old, read = cur, l.ls != nil // a plain Store reads again
		l.g.put(sl, old, math.MaxInt64)
	}
	return errContended
}

// load reads key's state into old.
func (l *Limiter) load(ctx context.Context, key string, now int64, old *int64) error {
	s, err := l.s.Load(ctx, key, now)
	if err != nil {
		return unavailable(err)
	}
	*old = s
	return nil
}

// step decides each request of round in turn, from state old at now, and
// returns the state they leave, its time to reset and how many were
// admitted. Stored states are offset by the fresh state, so that the 0 a
// store reads for a missing key is the fresh state.
func (l *Limiter) step(round []*request, old, now int64) (next int64, reset time.Duration, admitted int) {
	next = old
	for _, r := range round {
		s, d, err := l.a.Decide(next+l.fresh, now, r.n)
		r.d, r.err = d, err
		if err == nil && d.Allowed {
			next, reset = s-l.fresh, d.ResetAfter
			admitted++
		}
	}
	return next, reset, admitted
}

// swap stores next for key, of hash h, if its state is still old; on a
// LoadingStore a failed swap returns the key's state. Over a BatchStore
// it goes with the swaps of other keys waiting at the same moment.
func (l *Limiter) swap(ctx context.Context, key string, h uint64, old, next, now, exp int64) (int64, bool, error) {
	if l.bs != nil {
		sw := l.batch.swap(ctx, l.bs, h, Swap{Key: key, Old: old, Next: next, Now: now, Expires: exp})
		return sw.State, sw.Swapped, sw.Err
	}
	if l.ls != nil {
		return l.ls.CompareAndSwapLoad(ctx, key, old, next, now, exp)
	}
	ok, err := l.s.CompareAndSwap(ctx, key, old, next, now, exp)
	return 0, ok, err
}

// fail ends every request of round with err.
func fail(round []*request, err error) {
	for _, r := range round {
		r.d, r.err = throttle.Decision{}, err
	}
}

// guessSlots is the size of a Limiter's table of guesses.
const guessSlots = 4096

// guesses are the states a Limiter last saw of its keys, in a two-way
// set-associative table by a hash of the key. A guess is only a guess: a
// wrong one (another writer since, another key in the slot, a tag and a
// state read from two writes racing) costs one call to the store, never a
// wrong decision, since a swap from it fails. Safe for concurrent use.
type guesses struct {
	slots [guessSlots]struct {
		tag     atomic.Uint64
		state   atomic.Int64
		expires atomic.Int64
	}
}

// slot is a key's place in the table: its index and its tag.
type slot struct {
	i   int
	tag uint64
}

// get returns the slot of the key of hash h and its guess at now, 0 (the
// fresh state) if neither way of its set holds the key or its state has
// expired (then the store has none live either, or one it drops on the
// next write); then the slot is an empty way, or one picked by the hash.
func (g *guesses) get(h uint64, now int64) (slot, int64) {
	set := int(h%(guessSlots/2)) * 2
	tag := h>>1 | 1<<63 // never 0, the tag of an empty slot
	victim := set + int(h>>63)
	for i := set; i < set+2; i++ {
		switch g.slots[i].tag.Load() {
		case tag:
			if g.slots[i].expires.Load() < now {
				return slot{i, tag}, 0
			}
			return slot{i, tag}, g.slots[i].state.Load()
		case 0:
			victim = i
		}
	}
	return slot{victim, tag}, 0
}

// put records state, live until expires, as the guess of the key of s;
// on a nil table it does nothing.
func (g *guesses) put(s slot, state, expires int64) {
	if g == nil {
		return
	}
	g.slots[s.i].state.Store(state)
	g.slots[s.i].expires.Store(expires)
	g.slots[s.i].tag.Store(s.tag)
}

// Quota reports the Algorithm's Quota.
func (l *Limiter) Quota() throttle.Quota {
	if l == nil || l.a == nil {
		return throttle.Quota{}
	}
	return l.a.Quota()
}

func unavailable(err error) error {
	return fmt.Errorf("%w: store: %w", throttle.ErrUnavailable, err)
}

// expires is now+after, saturated at the end of time: the instant from
// which the state decides as a fresh one.
func expires(now int64, after int64) int64 {
	if now > math.MaxInt64-after {
		return math.MaxInt64
	}
	return now + after
}
