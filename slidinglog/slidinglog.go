// Package slidinglog implements the sliding log: an exact limit of at most
// limit units in any window of time.
//
//	l, err := slidinglog.New(1000, time.Hour) // per key: never more than 1000 in any hour
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	d, err := l.Allow(ctx, accountID, 1)
//
// # Guarantee
//
// For every key and every half-open interval [t, t+window) of the
// limiter's clock, the units admitted at instants in that interval sum to
// at most limit, with no approximation: timestamps are kept to the
// nanosecond. The log is also never stricter than that: a request is
// admitted whenever admitting it keeps every such interval within limit.
// A denial's RetryAfter is exact to the nanosecond: the same request is
// denied 1 ns before it and admitted at it, if nothing else is admitted
// meanwhile. ResetAfter is when the newest admission leaves the window.
//
// Past throttle.WithMaxKeys, a key still in use may be evicted (least
// recently used first); its log then leaves a debt, its units counted as
// admitted at its newest admission rounded up to 2^bits.Len(limit) ns, that
// the key (or a new key sharing its cell of the debt table) starts from.
// The bound still holds; such a key is at worst denied slightly longer
// than its log would. Idle keys are always dropped before any eviction,
// and dropping an idle key loses nothing.
//
// Compared with a fixed or sliding window counter, the log never lets
// 2·limit through around a window edge (fixedwindow) and never estimates
// (slidingwindow); the price is memory per admission instead of per key.
//
// # Memory and cost
//
// The classic sliding log keeps a full timestamp (often a 24-byte
// time.Time) per admitted unit. This one keeps, per key, a ring of 8-byte
// entries, one per distinct nanosecond at which units were admitted during
// the last window (requests at the same nanosecond share it). Each entry
// packs a nanosecond offset from a per-key base, on bits.Len(window)+1
// bits, with a count in the remaining 63-bits.Len(window) bits: one entry
// holds at most 2^(63-bits.Len(window))-1 units, and a weighted request
// above that takes as many entries as it needs. That is 8,589,934,591
// units per entry for a 1 s window, 2,097,151 for 1 h, 2,047 for 30 days,
// 255 for 366 days (where AllowN(1<<22) writes 16,449 entries) and 1 at
// 146 years. So a key holds at most limit entries, 8·limit bytes (and at
// most 2^27+4 entries, 1 GiB: past that it denies until entries leave),
// and in practice 8 bytes per admission of the last window, in a buffer
// whose length is a power of two, plus a 112-byte state on 64-bit
// platforms, kept in the keyed map's slot, which holds the newest four
// entries itself: a key with at most four entries in its window has no
// buffer, and an admission to a busier key writes its buffer once in four
// (four entries at a time). With the slot's header, the state fills one
// aligned pair of cache lines, so that a decision on a key not in cache
// waits for one memory access, not two dependent ones. The ring never
// shrinks while the key is live, but a key that admitted nothing for a
// whole window is back to empty and the keyed Limiter drops it entirely
// (lazily as new keys arrive, by Sweep, or by the sweeper of
// throttle.WithSweepInterval).
//
// An admission costs O(1) amortized: expiring old entries is paid for by
// their admission, and the base is moved (rewriting the live offsets) at
// most once per window. A denial costs O(1) for n = 1 and at most O(n)
// entries for a weighted request. Neither allocates once the ring has
// grown to the key's working size.
//
// # Concurrency
//
// A log is several words that change together (the ring, its head, size,
// total and base), so admissions take a per-log sync.Mutex, held for a
// few nanoseconds; distinct keys never share one. A lock-free ring of
// weighted entries would need a copy per decision (an allocation) or a
// multi-word compare-and-swap, both dearer than an uncontended mutex (one
// compare-and-swap to lock, one atomic add to unlock). Denials, the
// common case under overload, do not lock: while a log is full it
// publishes, through a sequence lock, when its oldest entry expires, and a
// request for one unit made before then is denied from that alone, with
// four atomic loads and no write to shared memory.
//
// # Clock
//
// The guarantee is stated on the limiter's clock: the monotonic system
// clock by default, or the one given with throttle.WithClock. If an
// injected clock steps back, a log takes time as standing still at the
// latest time it has seen, so it stays ordered and the bound holds on the
// times it records; a key dropped while idle forgets that time.
package slidinglog

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Log is a sliding log guarding a single resource: at most limit units
// in any window. It is safe for concurrent use by multiple goroutines.
// The zero value is not usable; create one with NewLog.
type Log struct {
	p   params
	clk clock.Source
	log log
}

// NewLog returns a Log admitting at most limit units in any window. Of
// the options only WithClock applies. Errors wrap throttle.ErrInvalid:
// limit <= 0, window <= 0 or above 146 years, a bad option.
func NewLog(limit int, window time.Duration, opts ...throttle.Option) (*Log, error) {
	p, err := newParams(limit, window)
	if err != nil {
		return nil, err
	}
	s, err := limiterkit.NewSingleSettings(opts...)
	if err != nil {
		return nil, err
	}
	return &Log{p: p, clk: clock.New(s.Clock)}, nil
}

// Allow is AllowN(n); the key and ctx are ignored.
func (l *Log) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = l.allow(&d, n)
	return d, err
}

// AllowN admits n units now if the last window holds room for them. It
// never blocks. Errors wrap throttle.ErrInvalid (n <= 0) or
// throttle.ErrExceedsLimit (n > limit).
func (l *Log) AllowN(n int) (d throttle.Decision, err error) {
	err = l.allow(&d, n)
	return d, err
}

// allow is AllowN filling d (see limiterkit.Fill).
func (l *Log) allow(d *throttle.Decision, n int) error {
	if err := limiterkit.CheckN(n, int(l.p.limit)); err != nil {
		return err
	}
	now := l.clk.Now()
	if retry, reset, ok := l.log.denyFast(now, n); ok {
		l.p.fill(d, false, 0, retry, reset)
		return nil
	}
	l.log.mu.Lock()
	ok, rem, retry, reset := l.log.decide(&l.p, now, int64(n))
	l.log.mu.Unlock()
	l.p.fill(d, ok, rem, retry, reset)
	return nil
}

// Limit returns the most units admitted in any window.
func (l *Log) Limit() int { return int(l.p.limit) }

// Limiter is a sliding log per key: at most limit units per key in any
// window. It is safe for concurrent use by multiple goroutines. The zero
// value is not usable; create one with New.
type Limiter struct {
	p params
	m *keyed.Map[state, *state]
}

// state is the log of one key, kept in the map's slot: 112 bytes, so that
// with the slot's 16-byte header it fills one aligned pair of cache lines
// (TestStateSize), and a decision on a key not in cache waits for one
// memory access. The zero value is an empty log.
type state struct {
	log
	p *params // the limiter's, set on first use: Retire and Evict need it
}

// Retire kills the log if it is empty at now, or if force. A log in use
// at that moment is not idle, so Retire does not wait for it unless force.
// It implements keyed.Retirer.
func (s *state) Retire(j keyed.Judge, force bool) bool {
	if force {
		s.mu.Lock()
	} else if !s.mu.TryLock() {
		return false
	}
	defer s.mu.Unlock()
	if !s.dead() && (force || s.total == 0 || s.p.after(s.newest(s.p)) <= j.Now()) {
		s.kill() // give the buffer back now, not when the map drops s
	}
	return s.dead()
}

// Move kills the log and moves what it held into dst, a zero state nobody
// else sees yet. It implements keyed.State: the map moves states when it
// rebuilds a table.
func (s *state) Move(dst *state) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst.ring, dst.p = s.ring, s.p
	dst.full.Store(s.full.Load())
	dst.reset.Store(s.reset.Load())
	s.kill()
}

// New returns a Limiter admitting at most limit units per key in any
// window. Options set the clock and bound the keys (throttle.WithMaxKeys,
// WithMaxKeyLen, WithSweepInterval). Errors wrap throttle.ErrInvalid.
func New(limit int, window time.Duration, opts ...throttle.Option) (*Limiter, error) {
	p, err := newParams(limit, window)
	if err != nil {
		return nil, err
	}
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	l := &Limiter{p: p, m: keyed.New[state](s)}
	l.m.SetDebts(debts{&l.p})
	return l, nil
}

// Allow admits n units for key now if the key's last window holds room
// for them. It never blocks; ctx is ignored. Errors wrap
// throttle.ErrInvalid (n <= 0, empty or oversized key),
// throttle.ErrExceedsLimit (n > limit) or throttle.ErrClosed.
func (l *Limiter) Allow(_ context.Context, key string, n int) (d throttle.Decision, err error) {
	err = l.m.Decide(key, n, int(l.p.limit), func(s *state, now int64) (bool, error) {
		if retry, reset, ok := s.denyFast(now, n); ok {
			l.p.fill(&d, false, 0, retry, reset)
			return true, nil
		}
		s.mu.Lock()
		if s.dead() {
			// Retired or moved: look the key up again (Get lifts now to the
			// instant the log was judged empty at).
			s.mu.Unlock()
			return false, nil
		}
		if s.p == nil {
			s.p = &l.p // first use: no store, and no write barrier, on later ones
		}
		ok, rem, retry, reset := s.decide(&l.p, now, int64(n))
		s.mu.Unlock()
		l.p.fill(&d, ok, rem, retry, reset)
		return true, nil
	})
	return d, err
}

// Limit returns the most units admitted per key in any window.
func (l *Limiter) Limit() int { return int(l.p.limit) }

// Len returns the number of keys currently holding a log.
func (l *Limiter) Len() int { return l.m.Len() }

// Sweep drops the logs of the keys that admitted nothing during the last
// window, and returns how many it dropped. Calling it is optional: idle
// keys are also dropped as new keys arrive.
func (l *Limiter) Sweep() int { return l.m.Sweep() }

// Close stops the sweeper, if any. Allow then fails with an error
// wrapping throttle.ErrClosed. Close is idempotent and returns nil.
func (l *Limiter) Close() error { return l.m.Close() }
