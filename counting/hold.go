package counting

import (
	"context"

	"github.com/throttlekit/throttle"
)

var (
	_ throttle.Holder        = (*Limiter)(nil)
	_ throttle.Holder        = (*Semaphore)(nil)
	_ throttle.QuotaReporter = (*Limiter)(nil)
	_ throttle.QuotaReporter = (*Semaphore)(nil)
)

func noRelease() {}

// TryHold is Allow with the units' release attached: when the Decision is
// Allowed, release gives the n units back (only its first call counts).
// When denied, release does nothing. The key is ignored.
func (s *Semaphore) TryHold(_ context.Context, _ string, n int) (throttle.Decision, func(), error) {
	d, err := s.AllowN(n)
	if err != nil || !d.Allowed {
		return d, noRelease, err
	}
	return d, releaser(&s.s, uint64(n), &s.limit), nil
}

// Hold is Acquire; the key is ignored.
func (s *Semaphore) Hold(ctx context.Context, _ string, n int) (func(), error) {
	return s.Acquire(ctx, n)
}

// Quota reports the limit with a zero Window: units come back by release.
func (s *Semaphore) Quota() throttle.Quota { return throttle.Quota{Limit: s.Limit()} }

// TryHold is Allow with the units' release attached: when the Decision is
// Allowed, release gives the n units of key back (only its first call
// counts). When denied, release does nothing.
func (l *Limiter) TryHold(_ context.Context, key string, n int) (throttle.Decision, func(), error) {
	d, st, err := l.try(key, n)
	if st == nil {
		return d, noRelease, err
	}
	return d, releaser(&st.sem, uint64(n), &l.limit), nil
}

// try takes n units for key if they fit now and returns the key's state
// when it did.
func (l *Limiter) try(key string, n int) (throttle.Decision, *state, error) {
	lim, err := l.check(key, n)
	if err != nil {
		return throttle.Decision{}, nil, err
	}
	for {
		b, _ := l.m.Get(key, 0) // counting states ignore time
		s := b.State()
		ok, cur, isDead := s.tryAcquire(uint64(n), uint64(lim))
		if isDead {
			continue
		}
		d := throttle.Decision{Allowed: ok, Limit: int(lim)}
		if !ok {
			d.Remaining = remaining(s.word.Load(), uint64(lim))
			return d, nil, nil
		}
		d.Remaining = int(max(lim-int64(cur), 0))
		return d, s, nil
	}
}

// Hold is Acquire.
func (l *Limiter) Hold(ctx context.Context, key string, n int) (func(), error) {
	return l.Acquire(ctx, key, n)
}

// Quota reports the limit per key with a zero Window: units come back by
// release.
func (l *Limiter) Quota() throttle.Quota { return throttle.Quota{Limit: l.Limit()} }
