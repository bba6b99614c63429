package redislimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/window"
)

// maxSlidingLimit is the largest limit of NewSlidingWindow, as in
// slidingwindow.MaxLimit.
const maxSlidingLimit = 1<<24 - 1

// SlidingWindow is the weighted sliding window of slidingwindow.New shared
// through Redis: windows aligned to the Unix epoch, and n units admitted
// at elapsed time e into the current window when
// prev·(W-e)/W + cur + n ≤ limit, computed exactly. It has the same
// decisions as slidingwindow.Limiter for the same trace.
//
// A SlidingWindow is safe for concurrent use. The zero value is not
// usable; call NewSlidingWindow.
type SlidingWindow struct{ windowed }

var (
	_ throttle.Limiter       = (*SlidingWindow)(nil)
	_ throttle.QuotaReporter = (*SlidingWindow)(nil)
)

// NewSlidingWindow returns a weighted sliding-window limiter of limit
// units per window. Errors wrap throttle.ErrInvalid.
func NewSlidingWindow(client redis.UniversalClient, limit int, w time.Duration, opts ...Option) (*SlidingWindow, error) {
	if limit <= 0 || limit > maxSlidingLimit {
		return nil, fmt.Errorf("%w: limit %d out of range [1, %d]", throttle.ErrInvalid, limit, maxSlidingLimit)
	}
	win, err := newWindowed(client, "sw", limit, w, 2, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingWindow{win}, nil
}

// Allow admits n units for key now or denies them, in one round trip.
func (l *SlidingWindow) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return l.allowWith(ctx, key, n, l.allow)
}

func (l *SlidingWindow) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	r, err := l.runAligned(ctx, slidingWindowScript, key, n)
	if err != nil {
		return l.fail(ctx, key, n, err)
	}
	prev, cur, used, start := integer(r[1]), integer(r[2]), integer(r[3]), integer(r[4])
	limit, W := int64(l.limit), l.window
	if integer(r[0]) == 1 {
		return throttle.Decision{
			Allowed: true, Limit: l.limit, Remaining: int(limit - used - int64(n)),
			ResetAfter: time.Duration(start + 2*W),
		}, nil
	}
	// Times are offsets from now, which is 0.
	retry, reset := window.WeightedRetry(limit, W, prev, cur, int64(n))
	return throttle.Decision{
		Limit: l.limit, Remaining: int(max(limit-used, 0)),
		RetryAfter: time.Duration(start + retry), ResetAfter: time.Duration(start + reset),
	}, nil
}
