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
	"math"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/limiterkit"
)

// MaxAttempts bounds the compare-and-swap attempts of one decision: each
// failed attempt means another writer's decision on the key succeeded.
const MaxAttempts = 1000

var (
	_ throttle.Limiter       = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
)

// Limiter decides with an Algorithm over the states of a Store, one per
// key. It is safe for concurrent use and holds nothing per key itself. The
// zero value is not usable: Allow fails with an error wrapping
// throttle.ErrInvalid; create it with New.
type Limiter struct {
	s     throttle.Store
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
	return &Limiter{s: s, a: a, fresh: a.Fresh(), limit: limit, clk: clock.New(set.Clock), keys: set}, nil
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
	return throttle.Decision{}, fmt.Errorf("%w: storelimit: key still contended after %d attempts", throttle.ErrUnavailable, MaxAttempts)
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
