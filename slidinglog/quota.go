package slidinglog

import (
	"time"

	"github.com/throttlekit/throttle"
)

// Quota reports the limit and the length of the window.
func (l *Log) Quota() throttle.Quota {
	return throttle.Quota{Limit: l.Limit(), Window: time.Duration(l.p.window)}
}

// Quota reports the limit and the length of the window.
func (l *Limiter) Quota() throttle.Quota {
	return throttle.Quota{Limit: l.Limit(), Window: time.Duration(l.p.window)}
}
