package httplimit

import "github.com/throttlekit/throttle"

// KeyQuotaReporter is a limiter whose limit depends on the key, such as
// rules.Limiter: the RateLimit fields state each key's own quota.
type KeyQuotaReporter interface {
	// KeyQuota returns key's quota and, for a bucket that returns units
	// one at a time, its rate (zero for a window); limited is false for a
	// key that is not limited (an allow list) or has no limit to state.
	KeyQuota(key string) (q throttle.Quota, refill throttle.Rate, limited bool)
}
