package leakybucket

import "github.com/throttlekit/throttle"

var (
	_ throttle.QuotaReporter = (*Bucket)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Pacer)(nil)
)
