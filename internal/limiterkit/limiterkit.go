// Package limiterkit is for the limiters and wrappers of this module: it
// turns the shared throttle.Options into Settings, checks keys and request
// sizes the way every limiter of this module does, builds Decisions and
// Reservations, and wraps a limiter in a Decorator that keeps its
// abilities (Decorate). Users of the limiters never need it.
package limiterkit

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/bridge"
)

// Defaults applied by NewSettings.
const (
	DefaultMaxKeys   = 1 << 20
	DefaultMaxKeyLen = 1 << 10
)

// Settings is the configuration built from throttle.Options.
type Settings struct {
	// Clock is the injected clock, or nil for the system clock.
	Clock throttle.Clock
	// MaxKeys bounds the number of keys a keyed limiter tracks.
	MaxKeys int
	// MaxKeyLen bounds the length of a key in bytes.
	MaxKeyLen int
	// SweepInterval, when positive, asks for a background sweeper that
	// drops keys whose state is back to full.
	SweepInterval time.Duration
}

// NewSettings applies opts over the defaults and validates the result.
// Errors wrap throttle.ErrInvalid.
func NewSettings(opts ...throttle.Option) (Settings, error) {
	v := bridge.Settings{MaxKeys: DefaultMaxKeys, MaxKeyLen: DefaultMaxKeyLen}
	for _, o := range opts {
		if o == nil {
			return Settings{}, fmt.Errorf("%w: nil Option", throttle.ErrInvalid)
		}
		o(&v)
	}
	s := Settings{MaxKeys: v.MaxKeys, MaxKeyLen: v.MaxKeyLen, SweepInterval: v.SweepInterval}
	if v.Clock != nil {
		s.Clock = v.Clock
	}
	switch {
	case v.ClockSet && v.Clock == nil:
		return s, fmt.Errorf("%w: WithClock(nil)", throttle.ErrInvalid)
	case s.MaxKeys <= 0:
		return s, fmt.Errorf("%w: WithMaxKeys(%d): must be positive", throttle.ErrInvalid, s.MaxKeys)
	case s.MaxKeyLen <= 0:
		return s, fmt.Errorf("%w: WithMaxKeyLen(%d): must be positive", throttle.ErrInvalid, s.MaxKeyLen)
	case s.SweepInterval < 0:
		return s, fmt.Errorf("%w: WithSweepInterval(%v): must not be negative", throttle.ErrInvalid, s.SweepInterval)
	}
	return s, nil
}

// NewSingleSettings is NewSettings for a limiter of one resource, which
// keeps no per-key state: an option only keyed limiters use (WithMaxKeys,
// WithMaxKeyLen, WithSweepInterval) is an error wrapping
// throttle.ErrInvalid rather than silently ignored.
func NewSingleSettings(opts ...throttle.Option) (Settings, error) {
	var v bridge.Settings
	for _, o := range opts {
		if o != nil {
			o(&v)
		}
	}
	if v.KeyedOption != "" {
		return Settings{}, fmt.Errorf("%w: %s is for keyed limiters; a limiter of one resource has no keys", throttle.ErrInvalid, v.KeyedOption)
	}
	return NewSettings(opts...)
}

// CheckKey returns an error wrapping throttle.ErrInvalid if key is empty or
// longer than MaxKeyLen.
func (s Settings) CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", throttle.ErrInvalid)
	}
	if len(key) > s.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes is longer than %d", throttle.ErrInvalid, len(key), s.MaxKeyLen)
	}
	return nil
}

// CheckN returns an error wrapping throttle.ErrInvalid if n <= 0, or
// wrapping throttle.ErrExceedsLimit if n > limit: a request no limiter of
// that capacity can ever grant.
func CheckN(n, limit int) error {
	if n <= 0 {
		return fmt.Errorf("%w: n must be positive, got %d", throttle.ErrInvalid, n)
	}
	if n > limit {
		return fmt.Errorf("%w: n=%d is above the limit %d", throttle.ErrExceedsLimit, n, limit)
	}
	return nil
}

// Fill sets every field of *d; durations are in nanoseconds. A limiter's
// Allow that fills its named result this way, rather than returning a
// Decision built by a helper, saves a copy: Decision has five fields, so
// the compiler passes a returned one through memory and copies it with
// wide loads, which stall on the narrow stores that just wrote it.
func Fill(d *throttle.Decision, allowed bool, limit, remaining, retryAfter, resetAfter int64) {
	d.Allowed = allowed
	d.Limit = int(limit)
	d.Remaining = int(remaining)
	d.RetryAfter = time.Duration(retryAfter)
	d.ResetAfter = time.Duration(resetAfter)
}
