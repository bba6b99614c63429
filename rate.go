package throttle

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"
)

// Rate is a number of events per period, kept as two integers so that no
// float rounding creeps into a limiter: PerSecond(3) means exactly three
// events per 1e9 ns, not 0.333…s between events.
//
// Valid rates go from one event per year to 1e9 events per second. The
// zero Rate is invalid; limiters reject it with an error wrapping
// ErrInvalid.
type Rate struct {
	count int64         // events per period, > 0 when valid
	per   time.Duration // period, > 0 when valid
}

// Bounds of a valid Rate (see bridge).
const (
	maxPeriod    = bridge.MaxPeriod
	maxPerSecond = bridge.MaxPerSecond
)

// NewRate returns the rate of count events per period per. It is reduced
// to lowest terms, so NewRate(10, 10*time.Second) equals
// NewRate(1, time.Second). "At most once every six seconds" is
// NewRate(1, 6*time.Second).
// Use Validate (or hand it to a limiter) to learn whether it is usable.
func NewRate(count int, per time.Duration) Rate {
	c, p := int64(count), int64(per)
	if c > 0 && p > 0 {
		g := gcd(c, p)
		c, p = c/g, p/g
	}
	return Rate{count: c, per: time.Duration(p)}
}

// PerSecond returns the rate of n events per second.
func PerSecond(n int) Rate { return NewRate(n, time.Second) }

// ParseRate parses "count/period", where period is a Go duration ("1m",
// "6s", "250ms"), a number of days ("2d"), or a bare unit: ns, us, ms, s,
// sec, second, m, min, minute, h, hour, d, day. Examples: "100/s",
// "5/1m", "1/6s", "86400/day". Errors wrap ErrInvalid.
func ParseRate(s string) (Rate, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w: rate %q: want count/period, e.g. 100/s", ErrInvalid, s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	switch {
	case err == nil && n > maxPerSecond*int64(maxPeriod/time.Second),
		errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(strings.TrimSpace(num), "-"):
		return Rate{}, fmt.Errorf("%w: rate %q: count is too large (at most %d per second)", ErrInvalid, s, maxPerSecond)
	case err != nil || n <= 0:
		return Rate{}, fmt.Errorf("%w: rate %q: count must be a positive integer", ErrInvalid, s)
	}
	per, err := parsePeriod(strings.TrimSpace(unit))
	if err != nil {
		return Rate{}, fmt.Errorf("%w: rate %q: %v", ErrInvalid, s, err)
	}
	r := NewRate(int(n), per)
	if err := r.Validate(); err != nil {
		return Rate{}, fmt.Errorf("rate %q: %w", s, err)
	}
	return r, nil
}

var bareUnits = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond,
	"ms": time.Millisecond, "s": time.Second, "sec": time.Second,
	"second": time.Second, "m": time.Minute, "min": time.Minute,
	"minute": time.Minute, "h": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
}

func parsePeriod(u string) (time.Duration, error) {
	if d, ok := bareUnits[strings.ToLower(u)]; ok {
		return d, nil
	}
	if days, ok := strings.CutSuffix(u, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n <= 0 || n > int64(maxPeriod/(24*time.Hour)) {
			return 0, fmt.Errorf("bad number of days %q", u)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(u)
	if err != nil {
		return 0, fmt.Errorf("bad period %q", u)
	}
	if d <= 0 {
		return 0, fmt.Errorf("period %q must be positive", u)
	}
	return d, nil
}

// Validate reports whether r is usable by a limiter. The error wraps
// ErrInvalid.
func (r Rate) Validate() error {
	switch {
	case r.count <= 0 || r.per <= 0:
		return fmt.Errorf("%w: rate must be positive (got %d per %v)", ErrInvalid, r.count, r.per)
	case r.count > int64(r.per):
		return fmt.Errorf("%w: rate %v is above %d per second", ErrInvalid, r, maxPerSecond)
	case ceilDiv(r.per, time.Duration(r.count)) > maxPeriod: // the interval as limiters round it
		return fmt.Errorf("%w: rate %v is slower than one event per %v", ErrInvalid, r, maxPeriod)
	}
	return nil
}

// Count returns the number of events per Period, in lowest terms.
func (r Rate) Count() int64 { return r.count }

// Period returns the period of the rate, in lowest terms.
func (r Rate) Period() time.Duration { return r.per }

// Duration returns the time it takes to earn n events, rounded up to a
// whole nanosecond, computed exactly in 128 bits. It saturates at
// math.MaxInt64 and returns 0 for n <= 0 or an invalid rate.
func (r Rate) Duration(n int64) time.Duration {
	if n <= 0 || r.count <= 0 || r.per <= 0 {
		return 0
	}
	return time.Duration(mulDiv(n, int64(r.per), r.count, true))
}

// Events returns how many whole events are earned in d, computed exactly
// in 128 bits. It saturates at math.MaxInt64 and returns 0 for d <= 0 or
// an invalid rate.
func (r Rate) Events(d time.Duration) int64 {
	if d <= 0 || r.count <= 0 || r.per <= 0 {
		return 0
	}
	return mulDiv(int64(d), r.count, int64(r.per), false)
}

// mulDiv returns a·b/c for positive a, b and c, rounded down, or up when
// up is set, computed exactly in 128 bits and saturated at math.MaxInt64.
func mulDiv(a, b, c int64, up bool) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if q >= math.MaxInt64 {
		return math.MaxInt64
	}
	if up && rem != 0 {
		q++
	}
	return int64(q)
}

// String returns the rate as ParseRate reads it back: a whole count per
// second, minute, hour or day when there is one ("100/s", "5/m",
// "1000/h", "86401/d"), otherwise count/period in lowest terms ("1/7s",
// "3/7ms").
func (r Rate) String() string {
	if r.count <= 0 || r.per <= 0 {
		return strconv.FormatInt(r.count, 10) + "/" + r.per.String()
	}
	for _, u := range [...]struct {
		d    time.Duration
		name string
	}{{time.Second, "s"}, {time.Minute, "m"}, {time.Hour, "h"}, {24 * time.Hour, "d"}} {
		if u.d%r.per != 0 {
			continue
		}
		if hi, n := bits.Mul64(uint64(r.count), uint64(u.d/r.per)); hi == 0 && n <= math.MaxInt64 {
			return strconv.FormatUint(n, 10) + "/" + u.name
		}
	}
	return strconv.FormatInt(r.count, 10) + "/" + r.per.String()
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns a/b rounded up, for positive a and b, without overflow.
func ceilDiv(a, b time.Duration) time.Duration {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}
