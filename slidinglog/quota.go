package slidinglog

import "github.com/throttlekit/throttle"

// Quota reports the limit per window.
func (l *Log) Quota() throttle.Quota { return throttle.Quota{Limit: l.Limit(), Window: l.Window()} }

// Quota reports the limit per window.
func (l *Limiter) Quota() throttle.Quota { return throttle.Quota{Limit: l.Limit(), Window: l.Window()} }
