package tokenbucket

import (
	"context"

	"github.com/throttlekit/throttle"
)

var (
	_ throttle.QuotaAllower  = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Bucket)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
)

// bucketQuota is a bucket's limit per window: its burst, refilled from
// empty in burst intervals.
func bucketQuota(r throttle.Rate, burst int) throttle.Quota {
	if burst <= 0 {
		return throttle.Quota{}
	}
	return throttle.Quota{Limit: burst, Window: r.Duration(int64(burst))}
}

// Quota reports the burst and the time to refill it from empty; it follows
// SetRate and SetBurst.
func (b *Bucket) Quota() throttle.Quota { return bucketQuota(b.Rate(), b.Burst()) }

// Quota reports the burst and the time to refill it from empty; it follows
// SetRate and SetBurst.
func (l *Limiter) Quota() throttle.Quota { return bucketQuota(l.Rate(), l.Burst()) }

// AllowQuota is Allow under a limit given with the call, rate and burst,
// instead of the limiter's own: one Limiter can serve keys of different
// tiers. A key keeps what it has used when its limit changes, read under
// the new limit (as after SetRate and SetBurst). Errors wrap
// throttle.ErrInvalid (a bad key, n, rate or burst) or
// throttle.ErrExceedsLimit (n > burst).
func (l *Limiter) AllowQuota(_ context.Context, key string, n int, rate throttle.Rate, burst int) (d throttle.Decision, err error) {
	err = l.g.AllowWith(&d, key, n, rate, burst)
	return d, err
}
