// Package clock turns a throttle.Clock into the int64 nanoseconds that
// limiters compute with, reading the system clock on its fastest path.
package clock

import (
	"context"
	"time"
)

// Clock is the structural twin of throttle.Clock.
type Clock interface{ Now() time.Time }

var (
	start     = time.Now()
	startNano = start.UnixNano()
)

// Source reads the time as nanoseconds since the Unix epoch. The zero
// value reads the system clock, advancing monotonically.
type Source struct{ c Clock }

// New returns a Source that reads c, or the system clock when c is nil.
func New(c Clock) Source { return Source{c: c} }

// Now returns the current time in nanoseconds since the Unix epoch. On the
// system clock it reads only the monotonic clock, which costs about half
// of time.Now.
func (s Source) Now() int64 {
	if s.c == nil {
		return startNano + int64(time.Since(start))
	}
	return s.c.Now().UnixNano()
}

// Sleep waits d, or until ctx ends if that comes first, and returns
// ctx.Err(): nil when d passed and ctx is still live.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return ctx.Err()
}
