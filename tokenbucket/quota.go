package tokenbucket

import (
	"context"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gcra"
)

var (
	_ throttle.QuotaAllower  = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Bucket)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
)

// AllowQuota is Allow under a limit given with the call, rate and burst,
// instead of the limiter's own: one Limiter can serve keys of different
// tiers. A key keeps what it has used when its limit changes, read under
// the new limit (as after SetRate and SetBurst). Errors wrap
// throttle.ErrInvalid (a bad key, n, rate or burst) or
// throttle.ErrExceedsLimit (n > burst).
func (l *Limiter) AllowQuota(_ context.Context, key string, n int, rate throttle.Rate, burst int) (d throttle.Decision, err error) {
	err = gcra.KeyedOf(&l.limiter).AllowWith(&d, key, n, rate, burst)
	return d, err
}
