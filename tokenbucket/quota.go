package tokenbucket

import "github.com/throttlekit/throttle"

var (
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
