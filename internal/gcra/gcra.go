// Package gcra is the Generic Cell Rate Algorithm shared by the token
// bucket and the leaky bucket (meter and pacer): the three are one
// algorithm seen from different sides, so they share one implementation.
//
// The whole state of a bucket is one int64, the theoretical arrival time
// (TAT): the instant, in nanoseconds since the Unix epoch, at which the
// bucket is full again. With I the emission interval (Rate.Duration(1), in
// whole nanoseconds) and tau = burst·I the tolerance, a request of n units
// at now is admitted if
//
//	max(TAT, now) + n·I - now <= tau
//
// and then TAT becomes max(TAT, now) + n·I, in one compare-and-swap. The
// number of free units at now is floor((tau - (TAT-now)) / I), the level of
// the leaky bucket is ceil((TAT-now) / I); both are derived, never stored.
//
// Guarantee: from any state and any instant t0, the units admitted in
// [t0, t0+d] never exceed burst + Events(d) of the configured rate. Each
// unit costs exactly I nanoseconds; when the rate's period is not a whole
// multiple of its count (PerSecond(3)), I is rounded up to the next
// nanosecond, so the limiter runs at most 1 ns per unit slower than the
// nominal rate and never faster.
package gcra

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// MaxSpan bounds the tolerance burst·interval of a bucket (about 36
// years). External debits are saturated at twice that ahead of now.
const MaxSpan = int64(1) << 60

// End is the latest TAT a state holds: the end of int64 time, 2262-04-11.
// A booking whose TAT would pass it is refused (Take reports End, and the
// buckets fail with ErrEndOfTime), and a debit saturates at it, so that
// TAT never overflows: a bucket is exact up to its last representable
// instant and refuses, never wraps, after.
const End = math.MaxInt64

// ErrEndOfTime is the error of a decision whose bucket would be full again
// only after End; it wraps throttle.ErrInvalid.
var ErrEndOfTime = fmt.Errorf("%w: the bucket would be full again after 2262-04-11, the end of int64 nanosecond time: a clock reading that late needs a shorter burst·interval", throttle.ErrInvalid)

// maxDebt is how far ahead of now external debits may push TAT.
const maxDebt = 2 * MaxSpan

// dead marks a state retired from a keyed map; decisions that see it
// look the key up again. No TAT reaches it: a TAT is at least a clock
// reading plus a cost.
const dead = math.MinInt64 + 1

// Config is the immutable parameter set of a bucket. Buckets hold it
// behind an atomic pointer so that SetRate and SetBurst swap it whole.
type Config struct {
	Rate     throttle.Rate
	Burst    int
	Interval int64 // nanoseconds per unit, Rate.Duration(1), rounded up
	Tau      int64 // Burst * Interval

	// magic and shift divide by Interval without a division instruction:
	// floor(x/Interval) is the high word of x·magic shifted right by
	// shift, for 0 <= x < 2^divBits; magic is 0 when Interval is 1.
	magic uint64
	shift uint
}

// divBits bounds the dividends of Config.units: Tau <= MaxSpan < 2^divBits.
const divBits = 61

// newDivisor returns magic and shift for Config.units. With k = divBits +
// ceil(log2 d) and m = floor(2^k/d) + 1, floor(x/d) = floor(x·m / 2^k)
// for all 0 <= x < 2^divBits (Granlund and Montgomery, "Division by
// invariant integers using multiplication", 1994, theorem 4.2). When k <
// 64, m is pre-shifted left by 64-k (it still fits for d >= 2), so that
// the quotient is always the high word shifted right by k-64 or 0.
func newDivisor(d uint64) (magic uint64, shift uint) {
	if d == 1 {
		return 0, 0
	}
	k := divBits + uint(bits.Len64(d-1))
	if k < 64 {
		return ((uint64(1)<<k)/d + 1) << (64 - k), 0
	}
	q, _ := bits.Div64(uint64(1)<<(k-64), 0, d)
	return q + 1, k - 64
}

// units returns floor(x / Interval) for 0 <= x < 2^divBits.
func (c *Config) units(x int64) int64 {
	if c.magic == 0 {
		return x
	}
	hi, _ := bits.Mul64(uint64(x), c.magic)
	return int64(hi >> c.shift)
}

// NewConfig validates rate and burst. Errors wrap throttle.ErrInvalid.
func NewConfig(rate throttle.Rate, burst int) (*Config, error) {
	c := new(Config)
	if err := c.Set(rate, burst); err != nil {
		return nil, err
	}
	return c, nil
}

// Set makes c the configuration of rate and burst, for a Config that lives
// on the stack (a limit given with one call). Errors wrap
// throttle.ErrInvalid and leave c unchanged.
func (c *Config) Set(rate throttle.Rate, burst int) error {
	if err := rate.Validate(); err != nil {
		return err
	}
	if burst <= 0 {
		return fmt.Errorf("%w: burst must be positive, got %d", throttle.ErrInvalid, burst)
	}
	iv := int64(rate.Duration(1))
	if int64(burst) > MaxSpan/iv {
		return fmt.Errorf("%w: burst %d at rate %v spans more than %v", throttle.ErrInvalid, burst, rate, time.Duration(MaxSpan))
	}
	*c = Config{Rate: rate, Burst: burst, Interval: iv, Tau: int64(burst) * iv}
	c.magic, c.shift = newDivisor(uint64(iv))
	return nil
}

// Cost returns the time n units take to earn, n·Interval, saturated at
// maxDebt. n must be positive.
func (c *Config) Cost(n int64) int64 {
	if n > maxDebt/c.Interval {
		return maxDebt
	}
	return n * c.Interval
}

// Decision builds the Decision for a request of the given cost whose
// admission left the state at tat (ok) or found it at tat (denied), for a
// tat below End.
func (c *Config) Decision(now, tat, cost int64, ok bool) (d throttle.Decision) {
	_ = c.Fill(&d, now, tat, cost, ok)
	return d
}

// Fill is Decision writing into *d, all of whose fields it sets (in
// place: see limiterkit.Fill).
//
// It returns ErrEndOfTime for the refusal of a TAT past End (Take reported
// End), and nil otherwise.
func (c *Config) Fill(d *throttle.Decision, now, tat, cost int64, ok bool) error {
	debt := int64(0)
	if tat > now {
		// Unsigned: exact even for a clock stepped back by centuries.
		debt = int64(min(uint64(tat)-uint64(now), uint64(maxDebt)))
	}
	retry := int64(0)
	if !ok && tat != End {
		retry = debt + cost - c.Tau
	}
	limiterkit.Fill(d, ok, int64(c.Burst), c.units(max(c.Tau-debt, 0)), retry, debt)
	if !ok && tat == End {
		return ErrEndOfTime
	}
	return nil
}

// Decide admits or denies n units (checked by the caller) at now on st,
// which no keyed map retires, and fills d.
func (c *Config) Decide(d *throttle.Decision, st *State, now int64, n int) error {
	cost := int64(n) * c.Interval
	tat, ok, _ := st.Take(now, cost, c.Tau)
	return c.Fill(d, now, tat, cost, ok)
}

// Tokens returns floor((tau - (tat-now)) / Interval): the units free at
// now, Burst when full, negative when debits pushed the bucket past empty.
func (c *Config) Tokens(now, tat int64) int64 {
	if tat <= now {
		return int64(c.Burst)
	}
	debt := tat - now
	free := c.Tau - debt
	if free >= 0 {
		return c.units(free)
	}
	return -((-free + c.Interval - 1) / c.Interval)
}

// When returns the earliest instant at which a bucket whose TAT is tat
// holds k whole units if nothing is taken or debited meanwhile: now when
// it already does, End when k exceeds Burst.
func (c *Config) When(now, tat, k int64) int64 {
	if k > int64(c.Burst) {
		return End
	}
	if c.Tokens(now, tat) >= k {
		return now
	}
	// Fewer than Burst units, so tat > now: Tokens(t) >= k from
	// t = tat - Tau + k*Interval on, a sum that stays within int64.
	return tat - (c.Tau - k*c.Interval)
}

// Level returns ceil((tat-now) / Interval): the units in the leaky bucket
// at now, 0 when empty, above Burst after debits. Level = Burst - Tokens.
func (c *Config) Level(now, tat int64) int64 {
	return int64(c.Burst) - c.Tokens(now, tat)
}

// State is the per-bucket state: the TAT. Its zero value is a bucket full
// at any instant, before 1970 too: the word holds the TAT with its sign
// bit flipped, so that zero means a TAT of math.MinInt64. All methods are
// safe for concurrent use.
type State struct{ w atomic.Int64 }

// flip maps a TAT to the word that holds it and back.
func flip(x int64) int64 { return x ^ math.MinInt64 }

func (s *State) load() int64 { return flip(s.w.Load()) }

func (s *State) cas(old, next int64) bool { return s.w.CompareAndSwap(flip(old), flip(next)) }

// Take books cost nanoseconds at now if the resulting TAT is at most
// limit past now (limit = Tau for an immediate admission, Tau + maxWait
// for a reservation). It returns the new TAT when ok, the TAT that made it
// fail otherwise, or End (not ok) when the TAT would pass End: the caller
// fails with ErrEndOfTime. live is false when the state was retired from
// a keyed map; nothing happened then and the caller must look the key up
// again.
func (s *State) Take(now, cost, limit int64) (tat int64, ok, live bool) {
	for {
		old := s.load()
		if old == dead {
			return 0, false, false
		}
		tat, ok := Step(old, now, cost, limit)
		if !ok || s.cas(old, tat) {
			return tat, ok, true
		}
	}
}

// Step is GCRA's decision as a pure function: booking cost nanoseconds at
// now on a bucket whose TAT is tat succeeds if the new TAT is at most
// limit past now. It returns the new TAT and true, or the TAT that made it
// fail and false, or End and false when the new TAT would pass End. The
// TAT of a full bucket is any instant not after now (math.MinInt64 for a
// bucket never used).
func Step(tat, now, cost, limit int64) (int64, bool) {
	base := max(tat, now)
	if base > End-cost {
		return End, false
	}
	next := base + cost
	if uint64(next)-uint64(now) > uint64(limit) { // next > now: exact
		return tat, false
	}
	return next, true
}

// Debit charges cost at now without checking: TAT may go beyond the burst
// window (the bucket goes negative), up to maxDebt ahead of now and at
// most to End.
func (s *State) Debit(now, cost int64) (live bool) {
	ceiling := int64(End)
	if now <= End-maxDebt {
		ceiling = now + maxDebt
	}
	for {
		old := s.load()
		if old == dead {
			return false
		}
		next := max(old, now)
		next += max(min(cost, ceiling-next), 0)
		if next == old || s.cas(old, next) {
			return true
		}
	}
}

// Empty empties the bucket at now, tau being Config.Tau: its TAT is
// raised to now + tau, and one already past it (in debt) is left as it
// is. It reports false if the state was retired from a keyed map.
func (s *State) Empty(now, tau int64) (live bool) {
	for {
		old := s.load()
		if old == dead {
			return false
		}
		if old >= now+tau || s.cas(old, now+tau) {
			return true
		}
	}
}

// Refund undoes a Take that left the state at booked by moving TAT back by
// cost, but only if nothing was booked since (TAT still equals booked). It
// reports whether the refund happened. The result is never more generous
// than the state before the Take: the refunded TAT is max(previous TAT,
// time of the Take).
func (s *State) Refund(booked, cost int64) bool {
	return s.cas(booked, booked-cost)
}

// Load returns the TAT and whether the state is live.
func (s *State) Load() (tat int64, live bool) {
	t := s.load()
	return t, t != dead
}

// Retire marks the state dead if it is full at j.Now() (TAT <= now), read
// after loading TAT, or unconditionally when force is set, and reports
// whether it is dead. It implements keyed.Retirer.
func (s *State) Retire(j keyed.Judge, force bool) bool {
	for {
		old := s.load()
		if old == dead {
			return true
		}
		if !force && old > j.Now() {
			return false
		}
		if s.cas(old, dead) {
			return true
		}
	}
}

// Evict marks the state dead and returns the word it held: its debt, the
// TAT with its sign bit flipped, so that 0 is a full bucket (no debt). It
// implements keyed.Debtor.
func (s *State) Evict() int64 {
	for {
		old := s.load()
		if old == dead {
			return 0
		}
		if s.cas(old, dead) {
			return flip(old)
		}
	}
}

// Move marks the state dead and copies its TAT into dst. It implements
// keyed.State.
func (s *State) Move(dst *State) { dst.w.Store(s.Evict()) }

// Debts is the keyed.Debts of buckets: a debt is a state word (a TAT with
// its sign bit flipped).
type Debts struct{}

// Merge returns the later TAT.
func (Debts) Merge(a, b int64) int64 { return flip(max(flip(a), flip(b))) }

// Paid reports whether the bucket of debt d is full at now.
func (Debts) Paid(d, now int64) bool { return flip(d) <= now }

// Owe makes the fresh state s start with debt d.
func (Debts) Owe(s *State, d int64) { s.w.Store(d) }

// Limit returns the admission limit of a reservation with maxWait: Tau +
// maxWait, saturated so that a booked TAT stays within range.
func (c *Config) Limit(maxWait time.Duration) int64 {
	return c.Tau + min(max(int64(maxWait), 0), maxDebt)
}
