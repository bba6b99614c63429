package throttle

import (
	"time"

	"github.com/throttlekit/throttle/internal/bridge"
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
// Constructors reject invalid options with an error wrapping ErrInvalid.
type Option func(*options)

type options = bridge.Settings

// WithClock makes the limiter read time from c instead of the system clock.
func WithClock(c Clock) Option {
	return func(s *options) {
		s.Clock, s.ClockSet = c, true
		if c == nil {
			s.Clock = nil
		}
	}
}

// WithMaxKeys bounds the number of keys a keyed limiter tracks (default
// 1<<20). Past it, a key not used recently is evicted (CLOCK, an
// approximation of least-recently-used: a key used again since the
// eviction hand last passed it outlives keys used once).
// A limiter of one resource rejects it.
func WithMaxKeys(n int) Option {
	return func(s *options) { s.MaxKeys, s.KeyedOption = n, "WithMaxKeys" }
}

// WithMaxKeyLen bounds the length of a key in bytes (default 1024); longer
// keys are rejected with ErrInvalid. A limiter of one resource rejects it.
func WithMaxKeyLen(n int) Option {
	return func(s *options) { s.MaxKeyLen, s.KeyedOption = n, "WithMaxKeyLen" }
}

// WithSweepInterval starts a background goroutine, stopped by Close, that
// drops keys whose state is back to full every d. Idle keys are also
// dropped lazily as new keys arrive, so the sweeper is optional. A limiter
// of one resource rejects it.
func WithSweepInterval(d time.Duration) Option {
	return func(s *options) { s.SweepInterval, s.KeyedOption = d, "WithSweepInterval" }
}
