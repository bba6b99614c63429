package leakybucket

import "github.com/throttlekit/throttle"

var (
	_ throttle.QuotaReporter = (*Bucket)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Pacer)(nil)
)

func drainQuota(r throttle.Rate, capacity int) throttle.Quota {
	if capacity <= 0 {
		return throttle.Quota{}
	}
	return throttle.Quota{Limit: capacity, Window: r.Duration(int64(capacity))}
}

// Quota reports the capacity and the time to drain it.
func (b *Bucket) Quota() throttle.Quota { return drainQuota(b.Rate(), b.Capacity()) }

// Quota reports the capacity and the time to drain it.
func (l *Limiter) Quota() throttle.Quota { return drainQuota(l.Rate(), l.Capacity()) }

// Quota reports slack+1 slots (the most granted at once) and the time they
// take at the pacer's rate.
func (p *Pacer) Quota() throttle.Quota { return drainQuota(p.Rate(), p.Slack()+1) }
