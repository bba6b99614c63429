package gcra

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/keyed"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

const cacheLine = 64

// Single is one bucket guarding one resource. The TAT is padded by a
// whole cache line on each side, so that whatever the alignment of the
// enclosing object, no other field shares its line and its CAS traffic
// does not slow down the reads of the configuration. Safe for concurrent
// use.
type Single struct {
	cfg atomic.Pointer[Config]
	clk clock.Source
	_   [cacheLine]byte
	st  State
	_   [cacheLine - 8]byte
}

// Init makes b a full bucket. It must be called once, before any other
// method; on an uninitialized Single, the methods fail with ErrInvalid.
func (b *Single) Init(rate throttle.Rate, burst int, opts ...throttle.Option) error {
	s, err := limiterkit.NewSingleSettings(opts...)
	if err != nil {
		return err
	}
	c, err := NewConfig(rate, burst)
	if err != nil {
		return err
	}
	b.clk = clock.New(s.Clock)
	b.cfg.Store(c)
	return nil
}

// errZero is returned by the methods of a bucket that was not made by its
// constructor.
var errZero = fmt.Errorf("%w: zero bucket: use the constructor", throttle.ErrInvalid)

// Config returns the current configuration.
func (b *Single) Config() *Config { return b.cfg.Load() }

// Now reads the bucket's clock.
func (b *Single) Now() int64 { return b.clk.Now() }

// AllowN admits n units now or denies them, reading the clock once, and
// fills d (see Config.Fill for why in place).
func (b *Single) AllowN(d *throttle.Decision, n int) error {
	c := b.cfg.Load()
	if c == nil {
		return errZero
	}
	if n <= 0 || n > c.Burst {
		return limiterkit.CheckN(n, c.Burst)
	}
	// Config.Decide's body, inlined by hand: the call it would add to
	// every decision is not inlined by the compiler.
	now := b.clk.Now()
	cost := int64(n) * c.Interval
	tat, ok, _ := b.st.Take(now, cost, c.Tau)
	return c.Fill(d, now, tat, cost, ok)
}

// Reserve books n units at the earliest time they fit, if within maxWait.
func (b *Single) Reserve(n int, maxWait time.Duration) (throttle.Reservation, error) {
	c := b.cfg.Load()
	if c == nil {
		return throttle.Reservation{}, errZero
	}
	if err := limiterkit.CheckN(n, c.Burst); err != nil {
		return throttle.Reservation{}, err
	}
	if maxWait < 0 {
		return throttle.Reservation{}, fmt.Errorf("%w: negative maxWait %v", throttle.ErrInvalid, maxWait)
	}
	res, _, err := reserve(&b.st, c, b.clk.Now(), n, maxWait)
	return res, err
}

// Book is Reserve without the allocation of a Reservation: it returns the
// delay, and what Refund needs to give the booking back. Not ok with tat
// End means the booking would pass the end of time (ErrEndOfTime).
func (b *Single) Book(n int, maxWait time.Duration) (delay time.Duration, tat, cost int64, ok bool) {
	c := b.cfg.Load()
	now := b.clk.Now()
	cost = int64(n) * c.Interval
	limit := c.Limit(maxWait)
	tat, ok, _ = b.st.Take(now, cost, limit)
	if !ok && tat == End {
		return 0, End, cost, false
	}
	if !ok {
		return time.Duration(max(tat, now) + cost - now - limit), tat, cost, false
	}
	return time.Duration(max(tat-c.Tau-now, 0)), tat, cost, true
}

// Refund gives back a booking made by Book if nothing was booked since.
func (b *Single) Refund(tat, cost int64) bool { return b.st.Refund(tat, cost) }

// Debit charges n units without checking.
func (b *Single) Debit(n int64) error {
	c := b.cfg.Load()
	if c == nil {
		return errZero
	}
	if n <= 0 {
		return fmt.Errorf("%w: debit must be positive, got %d", throttle.ErrInvalid, n)
	}
	b.st.Debit(b.clk.Now(), c.Cost(n))
	return nil
}

// Tokens returns the whole units free now (negative below empty).
func (b *Single) Tokens() int64 {
	c := b.cfg.Load()
	if c == nil {
		return 0
	}
	tat, _ := b.st.Load()
	return c.Tokens(b.clk.Now(), tat)
}

// Level returns the units in the bucket now (above Burst after debits).
func (b *Single) Level() int64 {
	c := b.cfg.Load()
	if c == nil {
		return 0
	}
	tat, _ := b.st.Load()
	return c.Level(b.clk.Now(), tat)
}

// SetRate changes the rate, keeping the TAT.
func (b *Single) SetRate(r throttle.Rate) error { return setRate(&b.cfg, r) }

// SetBurst changes the burst, keeping the TAT.
func (b *Single) SetBurst(burst int) error { return setBurst(&b.cfg, burst) }

func setRate(p *atomic.Pointer[Config], r throttle.Rate) error {
	return swap(p, func(old *Config) (*Config, error) { return NewConfig(r, old.Burst) })
}

func setBurst(p *atomic.Pointer[Config], burst int) error {
	return swap(p, func(old *Config) (*Config, error) { return NewConfig(old.Rate, burst) })
}

// swap replaces *p by f(*p), atomically with respect to other swaps.
func swap(p *atomic.Pointer[Config], f func(*Config) (*Config, error)) error {
	for {
		old := p.Load()
		if old == nil {
			return errZero
		}
		c, err := f(old)
		if err != nil {
			return err
		}
		if p.CompareAndSwap(old, c) {
			return nil
		}
	}
}

func reserve(st *State, c *Config, now int64, n int, maxWait time.Duration) (throttle.Reservation, bool, error) {
	cost := int64(n) * c.Interval
	limit := c.Limit(maxWait)
	tat, ok, live := st.Take(now, cost, limit)
	switch {
	case !live:
		return throttle.Reservation{}, false, nil
	case !ok && tat == End:
		return throttle.Reservation{}, true, ErrEndOfTime
	case !ok:
		return throttle.Reservation{Delay: time.Duration(max(tat, now) + cost - now - limit), Limit: c.Burst}, true, nil
	}
	return limiterkit.NewReservation(time.Duration(max(tat-c.Tau-now, 0)), c.Burst, func() { st.Refund(tat, cost) }), true, nil
}

// Keyed is a set of buckets, one per key, sharing one configuration.
// Safe for concurrent use.
type Keyed struct {
	cfg atomic.Pointer[Config]
	m   *keyed.Map[State, *State]
}

// Init makes l an empty keyed limiter (every key starts full). It must be
// called once, before any other method.
func (l *Keyed) Init(rate throttle.Rate, burst int, opts ...throttle.Option) error {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return err
	}
	c, err := NewConfig(rate, burst)
	if err != nil {
		return err
	}
	l.m = keyed.New[State](s)
	l.m.SetDebts(Debts{})
	l.cfg.Store(c)
	return nil
}

// Config returns the current configuration.
func (l *Keyed) Config() *Config { return l.cfg.Load() }

// Map returns the underlying key map.
func (l *Keyed) Map() *keyed.Map[State, *State] { return l.m }

func (l *Keyed) checkKey(key string) error {
	if l.m == nil {
		return errZero
	}
	return l.m.Check(key)
}

// Allow admits n units for key now or denies them, reading the clock
// once, and fills d.
func (l *Keyed) Allow(d *throttle.Decision, key string, n int) error {
	return l.allow(d, key, n, l.cfg.Load()) // small enough to inline
}

// AllowWith is Allow under a limit given with the call instead of the
// shared configuration: the key keeps what it has used, read at rate and
// burst (as after SetRate and SetBurst).
func (l *Keyed) AllowWith(d *throttle.Decision, key string, n int, rate throttle.Rate, burst int) error {
	if l.m == nil {
		return errZero
	}
	var c Config
	if err := c.Set(rate, burst); err != nil {
		return err
	}
	return l.allow(d, key, n, &c)
}

func (l *Keyed) allow(d *throttle.Decision, key string, n int, c *Config) error {
	if l.m == nil {
		return errZero
	}
	cost := int64(n) * c.Interval
	return l.m.Decide(key, n, c.Burst, func(s *State, now int64) (bool, error) {
		tat, ok, live := s.Take(now, cost, c.Tau)
		if !live {
			return false, nil
		}
		return true, c.Fill(d, now, tat, cost, ok)
	})
}

// Reserve books n units for key at the earliest time they fit, if within
// maxWait.
func (l *Keyed) Reserve(key string, n int, maxWait time.Duration) (throttle.Reservation, error) {
	if err := l.checkKey(key); err != nil {
		return throttle.Reservation{}, err
	}
	c := l.cfg.Load()
	if err := limiterkit.CheckN(n, c.Burst); err != nil {
		return throttle.Reservation{}, err
	}
	if maxWait < 0 {
		return throttle.Reservation{}, fmt.Errorf("%w: negative maxWait %v", throttle.ErrInvalid, maxWait)
	}
	var res throttle.Reservation
	s, now := l.m.GetNow(key)
	err := l.m.Retry(key, s, now, func(s *State, now int64) (live bool, err error) {
		res, live, err = reserve(s, c, now, n, maxWait)
		return live, err
	})
	return res, err
}

// Debit charges n units to key without checking.
func (l *Keyed) Debit(key string, n int64) error {
	if err := l.checkKey(key); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%w: debit must be positive, got %d", throttle.ErrInvalid, n)
	}
	cost := l.cfg.Load().Cost(n)
	s, now := l.m.GetNow(key)
	return l.m.Retry(key, s, now, func(s *State, now int64) (bool, error) {
		return s.Debit(now, cost), nil
	})
}

// EmptyAll empties the bucket of every key held now (those in debt are
// left as they are). Decisions go on meanwhile: one on a bucket not
// emptied yet takes from it first.
func (l *Keyed) EmptyAll() {
	if l.m == nil {
		return
	}
	tau, now := l.cfg.Load().Tau, l.m.Now()
	l.m.Range(func(s *State) bool {
		s.Empty(now, tau)
		return true
	})
}

// tat returns the TAT of key, that of a full bucket if absent.
func (l *Keyed) tat(key string) int64 {
	// A dead state was retired (full) or moved to a rebuilt table: look
	// again once the move is done.
	for st := l.m.Load(key); st != nil; st = l.m.LoadAgain(key) {
		if tat, live := st.Load(); live {
			return tat
		}
	}
	var full State
	tat, _ := full.Load()
	return tat
}

// Tokens returns the whole units free for key now.
func (l *Keyed) Tokens(key string) int64 {
	if l.m == nil {
		return 0
	}
	return l.cfg.Load().Tokens(l.m.Now(), l.tat(key))
}

// Level returns the units in key's bucket now.
func (l *Keyed) Level(key string) int64 {
	if l.m == nil {
		return 0
	}
	return l.cfg.Load().Level(l.m.Now(), l.tat(key))
}

// SetRate changes the rate of every key, keeping their TATs.
func (l *Keyed) SetRate(r throttle.Rate) error { return setRate(&l.cfg, r) }

// SetBurst changes the burst of every key, keeping their TATs.
func (l *Keyed) SetBurst(burst int) error { return setBurst(&l.cfg, burst) }

// Close stops the sweeper, if any; later calls fail with ErrClosed.
func (l *Keyed) Close() error {
	if l.m == nil {
		return nil
	}
	return l.m.Close()
}
