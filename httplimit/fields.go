package httplimit

import (
	"time"

	"github.com/throttlekit/throttle"
)

// KeyQuotaReporter is a limiter whose limit depends on the key, such as
// rules.Limiter: the RateLimit fields state each key's own quota.
type KeyQuotaReporter interface {
	// KeyQuota returns key's quota and, for a bucket that returns units
	// one at a time, its rate (zero for a window); limited is false for a
	// key that is not limited (an allow list) or has no limit to state.
	KeyQuota(key string) (q throttle.Quota, refill throttle.Rate, limited bool)
}

// rater is a limiter whose units return one at a time at a rate: the
// token and leaky buckets.
type rater interface{ Rate() throttle.Rate }

// Reporter states the RateLimit fields of one limiter's decisions, as the
// middleware and grpclimit send them. Build it with NewReporter; it is
// immutable and safe for concurrent use when its limiter is.
type Reporter struct {
	quota throttle.QuotaReporter
	keyed KeyQuotaReporter
	rate  rater
}

// NewReporter returns the Reporter of l's decisions.
func NewReporter(l throttle.Limiter) Reporter {
	var r Reporter
	r.quota, _ = l.(throttle.QuotaReporter)
	r.keyed, _ = l.(KeyQuotaReporter)
	r.rate, _ = l.(rater)
	return r
}

// State returns what the fields state of decision d for key: the quota q
// (the key's own, the limiter's, or else d.Limit with no window), t, the
// time until more units are available (a denied request's RetryAfter; for
// an admitted one, when the next unit returns to a bucket, or the window
// ends, 0 for a full key), and whether key is limited at all (false for
// an allow-listed key, or a decision with no limit: no fields are sent).
func (r Reporter) State(key string, d throttle.Decision) (q throttle.Quota, t time.Duration, limited bool) {
	var refill throttle.Rate
	switch {
	case r.keyed != nil:
		if q, refill, limited = r.keyed.KeyQuota(key); !limited {
			return q, 0, false
		}
	case d.Allowed && d.Limit == 0:
		return q, 0, false // an allow list behind a wrapper
	case r.quota != nil:
		q = r.quota.Quota()
		if r.rate != nil {
			refill = r.rate.Rate()
		}
	default:
		q = throttle.Quota{Limit: d.Limit}
	}
	return q, until(d, refill), true
}

// Fields returns the RateLimit-Policy and RateLimit items of decision d
// for key under the policy name, or ok false when key is not limited.
func (r Reporter) Fields(name, key string, d throttle.Decision) (policy, limit string, ok bool) {
	q, t, ok := r.State(key, d)
	if !ok {
		return "", "", false
	}
	return PolicyField(name, q), LimitField(name, d.Remaining, t), true
}

// until is the time d states until more units are available: RetryAfter
// for a denial; for an admission, when the next unit returns to a bucket
// refilled at refill (ResetAfter, until full, less the time of the units
// after the first), else ResetAfter (a window's units return at its end).
func until(d throttle.Decision, refill throttle.Rate) time.Duration {
	switch {
	case !d.Allowed:
		return d.RetryAfter
	case d.ResetAfter <= 0 || d.Remaining >= d.Limit:
		return 0 // full
	}
	if p := refill.Interval(); refill.Count() > 0 && p > 0 {
		later := min(int64(d.Limit-d.Remaining-1), int64(d.ResetAfter/p))
		return d.ResetAfter - time.Duration(later)*p
	}
	return d.ResetAfter
}
