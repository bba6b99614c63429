// Package storelimit is a keyed limiter whose state lives in a
// throttle.Store (a SQL table, a Memcached, the in-memory Memory) and whose
// decisions are an Algorithm's pure step run in Go: one implementation of
// the read-decide-compare-and-swap loop for every store and every
// algorithm whose state fits one int64 (tokenbucket, leakybucket,
// fixedwindow, slidingwindow). A new backend implements two methods of
// throttle.Store and inherits the algorithms, their conformance suite and
// their differential traces.
//
// # Guarantees
//
// A decision's state change is one compare-and-swap on the key's stored
// state, so on a Store that is atomic per key (the contract of
// throttle.Store) the Limiter decides exactly as the in-process limiter
// of the same Algorithm on the same trace and clock, however many
// goroutines and processes share the store: nothing admitted is lost or
// counted twice. A denial reads once and writes nothing; an admission
// reads once and writes once, and reads and tries again only when another
// writer changed the key in between (at most MaxAttempts tries, then an
// error wrapping throttle.ErrUnavailable).
//
// On a throttle.LoadingStore the Limiter first decides on the state it
// last saw of the key (kept in a two-way table of 4096 guesses by a hash
// of the key, 64 KiB): an admission whose guess holds is then one call to the
// store, and a wrong guess costs nothing but the call that corrects it,
// since the swap fails and returns the state. A denial is decided on a
// state read from the store in the same call, as above.
//
// Each process decides with its own clock, passed to the store with every
// call (a store reads no clock), so processes sharing a store need
// synchronised clocks: a process whose clock is behind sees keys as more
// used, one whose clock is ahead by δ as less used, by what the limit
// refills in δ.
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
	"sync/atomic"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/limiterkit"
)

// MaxAttempts bounds the compare-and-swap attempts of one decision: each
// failed attempt means another writer's decision on the key succeeded.
const MaxAttempts = 1000

// Limiter decides with an Algorithm over the states of a Store, one per
// key. It is safe for concurrent use and holds nothing per key itself but
// guesses, over a LoadingStore. The zero value is not usable: Allow fails
// with an error wrapping throttle.ErrInvalid; create it with New.
type Limiter struct {
	s     throttle.Store
	ls    throttle.LoadingStore // s, when it is one
	g     *guesses              // with ls
	a     throttle.Algorithm
	fresh int64
	limit int
	clk   clock.Source
	keys  limiterkit.Settings
}

// New returns a limiter deciding with a over the states kept in s. The
// Options it reads are WithClock and WithMaxKeyLen; any other is refused
// (a store bounds its own keys and sweeps its own expired states). Errors
// wrap throttle.ErrInvalid.
func New(s throttle.Store, a throttle.Algorithm, opts ...throttle.Option) (*Limiter, error) {
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
	l := &Limiter{s: s, a: a, fresh: a.Fresh(), limit: limit, clk: clock.New(set.Clock), keys: set}
	if ls, ok := s.(throttle.LoadingStore); ok {
		l.ls, l.g = ls, &guesses{seed: maphash.MakeSeed()}
	}
	return l, nil
}

// Allow decides n units for key now. It reads the key's state from the
// store, decides with the Algorithm and, when it admits, stores the next
// state if the key's state is still the one read, else reads and decides
// again. Errors wrap throttle.ErrInvalid (a bad key or n, a zero Limiter,
// a stored state no Algorithm of this limit wrote), throttle.ErrExceedsLimit
// (n above the limit) or throttle.ErrUnavailable (the store failed, or the
// key stayed contended for MaxAttempts tries).
func (l *Limiter) Allow(ctx context.Context, key string, n int) (d throttle.Decision, err error) {
	if l == nil || l.s == nil {
		return d, fmt.Errorf("%w: zero storelimit.Limiter: use New", throttle.ErrInvalid)
	}
	if err := l.keys.CheckKey(key); err != nil {
		return d, err
	}
	if err := limiterkit.CheckN(n, l.limit); err != nil {
		return d, err
	}
	now := l.clk.Now()
	if l.ls != nil {
		return l.guess(ctx, key, n, now)
	}
	for range MaxAttempts {
		old, err := l.s.Load(ctx, key, now)
		if err != nil {
			return throttle.Decision{}, unavailable(err)
		}
		// Stored states are offset by the fresh state, so that the 0 a
		// store reads for a missing key is the fresh state.
		next, d, err := l.a.Decide(old+l.fresh, now, n)
		if err != nil || !d.Allowed {
			return d, err
		}
		ok, err := l.s.CompareAndSwap(ctx, key, old, next-l.fresh, now, expires(now, int64(d.ResetAfter)))
		if err != nil {
			return throttle.Decision{}, unavailable(err)
		}
		if ok {
			return d, nil
		}
	}
	return throttle.Decision{}, errContended
}

var errContended = fmt.Errorf("%w: storelimit: key still contended after %d attempts", throttle.ErrUnavailable, MaxAttempts)

// guess is Allow on a LoadingStore: it decides on the state last seen of
// key, and swaps and learns the state in one call. A denial, or an error,
// on a guess is decided again on the state read from the store.
func (l *Limiter) guess(ctx context.Context, key string, n int, now int64) (throttle.Decision, error) {
	slot, old := l.g.get(key)
	read := false // old is the store's state, read in this call
	for range MaxAttempts {
		// Stored states are offset by the fresh state, so that the 0 a
		// store reads for a missing key is the fresh state.
		next, d, err := l.a.Decide(old+l.fresh, now, n)
		if !read && (err != nil || !d.Allowed) {
			if old, err = l.s.Load(ctx, key, now); err != nil {
				return throttle.Decision{}, unavailable(err)
			}
			read = true
			l.g.put(slot, old)
			continue
		}
		if err != nil || !d.Allowed {
			return d, err
		}
		cur, ok, err := l.ls.CompareAndSwapLoad(ctx, key, old, next-l.fresh, now, expires(now, int64(d.ResetAfter)))
		if err != nil {
			return throttle.Decision{}, unavailable(err)
		}
		if ok {
			l.g.put(slot, next-l.fresh)
			return d, nil
		}
		old, read = cur, true
		l.g.put(slot, old)
	}
	return throttle.Decision{}, errContended
}

// guessSlots is the size of a Limiter's table of guesses.
const guessSlots = 4096

// guesses are the states a Limiter last saw of its keys, in a two-way
// set-associative table by a hash of the key. A guess is only a guess: a
// wrong one (another writer since, another key in the slot, a tag and a
// state read from two writes racing) costs one call to the store, never a
// wrong decision, since a swap from it fails. Safe for concurrent use.
type guesses struct {
	seed  maphash.Seed
	slots [guessSlots]struct {
		tag   atomic.Uint64
		state atomic.Int64
	}
}

// slot is a key's place in the table: its index and its tag.
type slot struct {
	i   int
	tag uint64
}

// get returns key's slot and its guess, 0 (the fresh state) if neither
// way of its set holds the key; then the slot is an empty way, or one
// picked by the hash.
func (g *guesses) get(key string) (slot, int64) {
	h := maphash.String(g.seed, key)
	set := int(h%(guessSlots/2)) * 2
	tag := h>>1 | 1<<63 // never 0, the tag of an empty slot
	victim := set + int(h>>63)
	for i := set; i < set+2; i++ {
		switch g.slots[i].tag.Load() {
		case tag:
			return slot{i, tag}, g.slots[i].state.Load()
		case 0:
			victim = i
		}
	}
	return slot{victim, tag}, 0
}

// put records state as the guess of the key of s.
func (g *guesses) put(s slot, state int64) {
	g.slots[s.i].state.Store(state)
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
