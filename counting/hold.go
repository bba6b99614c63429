package counting

import (
	"context"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

func noRelease() {}

// TryHold is Allow with the units' release attached: when the Decision is
// Allowed, release gives the n units back (only its first call counts).
// When denied, release does nothing. The key is ignored.
func (s *Semaphore) TryHold(_ context.Context, _ string, n int) (d throttle.Decision, release func(), err error) {
	if err = s.allow(&d, n); err != nil || !d.Allowed {
		return d, noRelease, err
	}
	return d, releaser(&s.s, uint64(n), &s.limit), nil
}

// Quota reports the limit with a zero Window: units come back by release.
func (s *Semaphore) Quota() throttle.Quota { return throttle.Quota{Limit: s.Limit()} }

// TryHold is Allow with the units' release attached: when the Decision is
// Allowed, release gives the n units of key back (only its first call
// counts). When denied, release does nothing.
func (l *Limiter) TryHold(_ context.Context, key string, n int) (d throttle.Decision, release func(), err error) {
	st, err := l.try(&d, key, n)
	if st == nil {
		return d, noRelease, err
	}
	return d, releaser(&st.sem, uint64(n), &l.limit), nil
}

// try takes n units for key if they fit now, fills d (see
// limiterkit.Fill) and returns the key's state when it took them.
func (l *Limiter) try(d *throttle.Decision, key string, n int) (*state, error) {
	lim, err := l.check(key, n)
	if err != nil {
		return nil, err
	}
	for {
		b, _ := l.m.Get(key, 0) // counting states ignore time
		s := b.State()
		ok, cur, isDead := s.tryAcquire(uint64(n), uint64(lim))
		if isDead {
			continue
		}
		if !ok {
			limiterkit.Fill(d, false, lim, int64(remaining(s.word.Load(), uint64(lim))), 0, 0)
			return nil, nil
		}
		limiterkit.Fill(d, true, lim, max(lim-int64(cur), 0), 0, 0)
		return s, nil
	}
}

// Quota reports the limit per key with a zero Window: units come back by
// release.
func (l *Limiter) Quota() throttle.Quota { return throttle.Quota{Limit: l.Limit()} }
