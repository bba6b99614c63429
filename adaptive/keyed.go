package adaptive

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
	"github.com/throttlekit/throttle/internal/report"
)

// Keyed is one Limiter per key, each with its own Algorithm: a limit per
// downstream (a host, a shard, a method), each finding its own. It is
// safe for concurrent use by multiple goroutines; a key's look-up takes
// no lock and allocates nothing once the key is known. The zero value is
// not usable; create one with NewKeyed.
//
// A key's limiter is made on its first use and kept, with what it has
// learnt, for the life of the Keyed: keys are meant to be the few
// downstreams of a client, not its callers. Past throttle.WithMaxKeys
// keys, a new key is refused with an error wrapping throttle.ErrInvalid,
// and the known keys go on as before.
type Keyed struct {
	m      sync.Map   // key → *Limiter
	mu     sync.Mutex // held while a new key is made, so the key count is exact
	n      atomic.Int64
	newAlg func() Algorithm
	cfg    Config
	opts   []throttle.Option
	s      limiterkit.Settings
}

// NewKeyed returns a Keyed whose keys each get a Limiter of Config c and
// an Algorithm from newAlg. opts are passed to New (throttle.WithClock)
// and bound the keys (throttle.WithMaxKeys, throttle.WithMaxKeyLen).
// Errors wrap throttle.ErrInvalid.
func NewKeyed(newAlg func() Algorithm, c Config, opts ...throttle.Option) (*Keyed, error) {
	s, err := limiterkit.NewSettings(opts...)
	if err != nil {
		return nil, err
	}
	if newAlg == nil {
		return nil, fmt.Errorf("%w: adaptive: nil Algorithm maker", throttle.ErrInvalid)
	}
	if _, err := New(newAlg(), c, opts...); err != nil { // check c once
		return nil, err
	}
	return &Keyed{newAlg: newAlg, cfg: c, opts: opts, s: s}, nil
}

// Limiter returns the Limiter of key, making it if key is new.
func (k *Keyed) Limiter(key string) (*Limiter, error) {
	if l, ok := k.m.Load(key); ok {
		return l.(*Limiter), nil
	}
	if err := k.s.CheckKey(key); err != nil {
		return nil, err
	}
	// A new key: made under the lock, so that goroutines racing to make
	// the same key neither make it twice nor take the place of another.
	k.mu.Lock()
	defer k.mu.Unlock()
	if l, ok := k.m.Load(key); ok {
		return l.(*Limiter), nil
	}
	if k.n.Load() >= int64(k.s.MaxKeys) {
		return nil, fmt.Errorf("%w: adaptive: %d keys, the most WithMaxKeys allows", throttle.ErrInvalid, k.s.MaxKeys)
	}
	l, err := New(k.newAlg(), k.cfg, k.opts...)
	if err != nil {
		return nil, err
	}
	l.key = key
	k.m.Store(key, l)
	k.n.Add(1)
	return l, nil
}

// limiter is Limiter for a call of method m for n units of key: a key
// refused is reported as the call's EventError (key's limiter reports the
// others).
func (k *Keyed) limiter(m limiterkit.Method, key string, n int) (*Limiter, error) {
	l, err := k.Limiter(key)
	if err != nil && k.cfg.Observer != nil {
		rep := report.New(k.cfg.Name, k.cfg.Observer)
		rep.Call(m, key, n, throttle.Decision{}, err, time.Time{})
	}
	return l, err
}

// Allow is Limiter.Allow on key's limiter.
func (k *Keyed) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	l, err := k.limiter(limiterkit.MethodAllow, key, n)
	if err != nil {
		return throttle.Decision{}, err
	}
	return l.Allow(ctx, key, n)
}

// Release is Limiter.Release on key's limiter.
func (k *Keyed) Release(key string, n int, rtt time.Duration, o Outcome) error {
	l, err := k.Limiter(key)
	if err != nil {
		return err
	}
	return l.Release(n, rtt, o)
}

// TryHold is Limiter.TryHold on key's limiter.
func (k *Keyed) TryHold(ctx context.Context, key string, n int) (throttle.Decision, func(), error) {
	l, err := k.limiter(limiterkit.MethodTryHold, key, n)
	if err != nil {
		return throttle.Decision{}, noRelease, err
	}
	return l.TryHold(ctx, key, n)
}

// Hold is Limiter.Hold on key's limiter.
func (k *Keyed) Hold(ctx context.Context, key string, n int) (func(), error) {
	l, err := k.limiter(limiterkit.MethodHold, key, n)
	if err != nil {
		return nil, err
	}
	return l.Hold(ctx, key, n)
}
