package slidingwindow

import (
	"time"

	"github.com/throttlekit/throttle"
)

var (
	_ throttle.QuotaReporter = (*Window)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
)

func (c *config) quota() throttle.Quota {
	if c == nil {
		return throttle.Quota{}
	}
	return throttle.Quota{Limit: int(c.limit), Window: time.Duration(c.window)}
}

// Quota reports the limit per window (zero on a zero Window).
func (w *Window) Quota() throttle.Quota { return w.c.quota() }

// Quota reports the limit per window.
func (l *Limiter) Quota() throttle.Quota { return l.c.Load().quota() }
