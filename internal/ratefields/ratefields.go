// Package ratefields formats the RateLimit and RateLimit-Policy fields of
// the IETF draft (draft-ietf-httpapi-ratelimit-headers) from a limiter's
// decisions: what the HTTP middleware sends as header fields and the gRPC
// interceptors as metadata.
package ratefields

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
)

// keyQuota is a limiter whose limit depends on the key, such as
// rules.Limiter: the RateLimit fields state each key's own quota.
type keyQuota interface {
	// KeyQuota returns key's quota and, for a bucket that returns units
	// one at a time, its rate (zero for a window); limited is false for a
	// key that is not limited (an allow list) or has no limit to state.
	KeyQuota(key string) (q throttle.Quota, refill throttle.Rate, limited bool)
}

// rater is a limiter whose units return one at a time at a rate: the
// token and leaky buckets.
type rater interface{ Rate() throttle.Rate }

// Reporter states the RateLimit fields of one limiter's decisions, as
// httplimit and grpclimit send them. Build it with NewReporter; it is
// immutable and safe for concurrent use when its limiter is.
type Reporter struct {
	quota throttle.QuotaReporter
	keyed keyQuota
	rate  rater
}

// NewReporter returns the Reporter of l's decisions.
func NewReporter(l throttle.Limiter) Reporter {
	var r Reporter
	r.quota, _ = l.(throttle.QuotaReporter)
	r.keyed, _ = l.(keyQuota)
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
	return q, Until(d, refill), true
}

// Until is the time d states until more units are available: RetryAfter
// for a denial; for an admission, when the next unit returns to a bucket
// refilled at refill (ResetAfter, until full, less the time of the units
// after the first), else ResetAfter (a window's units return at its end).
func Until(d throttle.Decision, refill throttle.Rate) time.Duration {
	switch {
	case !d.Allowed:
		return d.RetryAfter
	case d.ResetAfter <= 0 || d.Remaining >= d.Limit:
		return 0 // full
	}
	if p := refill.Duration(1); refill.Count() > 0 && p > 0 {
		later := min(int64(d.Limit-d.Remaining-1), int64(d.ResetAfter/p))
		return d.ResetAfter - time.Duration(later)*p
	}
	return d.ResetAfter
}

// Policy formats one RateLimit-Policy item: "name";q=limit;w=seconds
// (w is left out for a limit with no window, such as a concurrency cap).
func Policy(name string, q throttle.Quota) string {
	var b strings.Builder
	b.Grow(len(name) + 24)
	b.WriteString(quoteSF(name))
	b.WriteString(";q=")
	b.WriteString(strconv.Itoa(max(q.Limit, 0)))
	if q.Window > 0 {
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(max(Seconds(q.Window), 1), 10))
	}
	return b.String()
}

// Limit formats one RateLimit item: "name";r=remaining;t=seconds. With
// no units left and no time stated (a full concurrency limit: time alone
// frees nothing), t is left out: "name";r=0.
func Limit(name string, remaining int, t time.Duration) string {
	if remaining <= 0 && t <= 0 {
		return quoteSF(name) + ";r=0"
	}
	return quoteSF(name) + ";r=" + strconv.Itoa(max(remaining, 0)) + ";t=" + strconv.FormatInt(Seconds(t), 10)
}

// Seconds rounds d up to whole seconds, saturating.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 && s < math.MaxInt64 {
		s++
	}
	return s
}

// ValidName reports whether s can name a policy: 1 to 64 printable
// ASCII characters.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// quoteSF writes s as a structured-field string (RFC 8941): quoted, with
// backslash and double quote escaped. s is printable ASCII.
func quoteSF(s string) string {
	if !strings.ContainsAny(s, `"\`) {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}
