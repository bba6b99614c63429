package throttle

import (
	"fmt"
	"time"
)

// Clock tells the time. Inject one with WithClock to drive a limiter on
// virtual time (see throttletest.Clock); by default limiters read the
// monotonic system clock.
type Clock interface {
	Now() time.Time
}

// Option configures what every limiter constructor in this module shares:
// the clock and the bounds on per-key state. Algorithm parameters (rate,
// burst, window, ...) are positional arguments of each constructor.
type Option func(*Settings)

// Settings is the configuration built from Options. Users set it through
// Options only; algorithm packages read it with NewSettings.
type Settings struct {
	// Clock is the injected clock, or nil for the system clock.
	Clock Clock
	// MaxKeys bounds the number of keys a keyed limiter tracks. When a
	// new key would exceed it, the least recently used key is evicted.
	MaxKeys int
	// MaxKeyLen bounds the length of a key in bytes.
	MaxKeyLen int
	// SweepInterval, when positive, runs a background sweeper that drops
	// keys whose state is back to full. Idle keys are also dropped lazily
	// as new keys arrive, so the sweeper is optional.
	SweepInterval time.Duration

	clockSet bool // WithClock was used, so a nil Clock is a mistake
}

// Defaults applied by NewSettings.
const (
	DefaultMaxKeys   = 1 << 20
	DefaultMaxKeyLen = 1 << 10
)

// WithClock makes the limiter read time from c instead of the system clock.
func WithClock(c Clock) Option { return func(s *Settings) { s.Clock, s.clockSet = c, true } }

// WithMaxKeys bounds the number of keys a keyed limiter tracks (default
// DefaultMaxKeys). Past it, the least recently used key is evicted.
func WithMaxKeys(n int) Option { return func(s *Settings) { s.MaxKeys = n } }

// WithMaxKeyLen bounds the length of a key in bytes (default
// DefaultMaxKeyLen); longer keys are rejected with ErrInvalid.
func WithMaxKeyLen(n int) Option { return func(s *Settings) { s.MaxKeyLen = n } }

// WithSweepInterval starts a background goroutine, stopped by Close, that
// drops keys whose state is back to full every d.
func WithSweepInterval(d time.Duration) Option { return func(s *Settings) { s.SweepInterval = d } }

// NewSettings applies opts over the defaults and validates the result.
// Errors wrap ErrInvalid.
func NewSettings(opts ...Option) (Settings, error) {
	s := Settings{MaxKeys: DefaultMaxKeys, MaxKeyLen: DefaultMaxKeyLen}
	for _, o := range opts {
		if o == nil {
			return s, fmt.Errorf("%w: nil Option", ErrInvalid)
		}
		o(&s)
	}
	switch {
	case s.clockSet && s.Clock == nil:
		return s, fmt.Errorf("%w: WithClock(nil)", ErrInvalid)
	case s.MaxKeys <= 0:
		return s, fmt.Errorf("%w: WithMaxKeys(%d): must be positive", ErrInvalid, s.MaxKeys)
	case s.MaxKeyLen <= 0:
		return s, fmt.Errorf("%w: WithMaxKeyLen(%d): must be positive", ErrInvalid, s.MaxKeyLen)
	case s.SweepInterval < 0:
		return s, fmt.Errorf("%w: WithSweepInterval(%v): must not be negative", ErrInvalid, s.SweepInterval)
	}
	return s, nil
}

// CheckKey returns an error wrapping ErrInvalid if key is empty or longer
// than MaxKeyLen.
func (s Settings) CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if len(key) > s.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes is longer than %d", ErrInvalid, len(key), s.MaxKeyLen)
	}
	return nil
}

// CheckN returns an error wrapping ErrInvalid if n <= 0, or wrapping
// ErrExceedsLimit if n > limit: a request no limiter of that capacity can
// ever grant.
func CheckN(n, limit int) error {
	if n <= 0 {
		return fmt.Errorf("%w: n must be positive, got %d", ErrInvalid, n)
	}
	if n > limit {
		return fmt.Errorf("%w: n=%d is above the limit %d", ErrExceedsLimit, n, limit)
	}
	return nil
}
