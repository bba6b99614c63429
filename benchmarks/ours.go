package benchmarks

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/tokenbucket"
)

// ours are this module's algorithms, one line each. Single-resource types
// ignore the key; keyed ones run the many-key workloads too.
var ours = []Subject{
	{Name: "tokenbucket.Bucket", Ours: true, Algo: "token bucket (GCRA)", VirtualTime: true, Weighted: true, New: rateBurst(tokenbucket.NewBucket)},
	{Name: "tokenbucket.Limiter", Ours: true, Algo: "token bucket (GCRA)", Keyed: true, VirtualTime: true, Weighted: true, New: rateBurst(tokenbucket.New)},
	{Name: "leakybucket.Bucket", Ours: true, Algo: "leaky bucket (meter)", VirtualTime: true, Weighted: true, New: rateBurst(leakybucket.NewBucket)},
	{Name: "leakybucket.Limiter", Ours: true, Algo: "leaky bucket (meter)", Keyed: true, VirtualTime: true, Weighted: true, New: rateBurst(leakybucket.New)},
	{Name: "leakybucket.Pacer", Ours: true, Algo: "leaky bucket (pacer)", Blocks: true, Note: "Take waits for its slot, like uber/ratelimit; built with uber's default slack of 10 and an unbounded queue", New: newPacer},
	{Name: "fixedwindow.Window", Ours: true, Algo: "fixed window (aligned)", VirtualTime: true, Weighted: true, New: limitWindow(fixedwindow.NewWindow)},
	{Name: "fixedwindow.Limiter", Ours: true, Algo: "fixed window (aligned)", Keyed: true, VirtualTime: true, Weighted: true, New: limitWindow(fixedwindow.New)},
	{Name: "fixedwindow anchored", Ours: true, Algo: "fixed window (anchored)", Keyed: true, VirtualTime: true, Weighted: true, Note: "fixedwindow.NewAnchored: each key's window opens at its first hit", New: limitWindow(fixedwindow.NewAnchored)},
	{Name: "slidingwindow.Window", Ours: true, Algo: "sliding window (weighted)", VirtualTime: true, Weighted: true, New: limitWindow(slidingwindow.NewWindow)},
	{Name: "slidingwindow.Limiter", Ours: true, Algo: "sliding window (weighted)", Keyed: true, VirtualTime: true, Weighted: true, New: limitWindow(slidingwindow.New)},
	{Name: "slidingwindow slotted", Ours: true, Algo: "sliding window (10 slots)", Keyed: true, VirtualTime: true, Weighted: true, Note: "slidingwindow.NewSlotted with 10 slots", New: limitWindow(slotted(10))},
	{Name: "slidinglog.Log", Ours: true, Algo: "sliding log", VirtualTime: true, Weighted: true, New: limitWindow(slidinglog.NewLog)},
	{Name: "slidinglog.Limiter", Ours: true, Algo: "sliding log", Keyed: true, VirtualTime: true, Weighted: true, New: limitWindow(slidinglog.New)},
}

// options turns a Config into the cross-cutting options of our constructors.
func options(c Config) []throttle.Option {
	if c.Clock == nil {
		return nil
	}
	return []throttle.Option{throttle.WithClock(c.Clock)}
}

// rateBurst adapts a constructor taking (rate, burst): burst Limit,
// refilled at Limit per Window.
func rateBurst[T throttle.Limiter](f func(throttle.Rate, int, ...throttle.Option) (T, error)) func(Config) (throttle.Limiter, error) {
	return func(c Config) (throttle.Limiter, error) {
		l, err := f(c.Rate(), c.Limit, options(c)...)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
}

// limitWindow adapts a constructor taking (limit, window).
func limitWindow[T throttle.Limiter](f func(int, time.Duration, ...throttle.Option) (T, error)) func(Config) (throttle.Limiter, error) {
	return func(c Config) (throttle.Limiter, error) {
		l, err := f(c.Limit, c.Window, options(c)...)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
}

// pacer adapts leakybucket.Pacer: Allow waits for the slot.
type pacer struct {
	p     *leakybucket.Pacer
	limit int
}

func newPacer(c Config) (throttle.Limiter, error) {
	p, err := leakybucket.NewPacer(c.Rate(), 10, leakybucket.Unbounded, options(c)...)
	if err != nil {
		return nil, err
	}
	return &pacer{p: p, limit: c.Limit}, nil
}

func (p *pacer) Allow(ctx context.Context, _ string, n int) (throttle.Decision, error) {
	for range n {
		if err := p.p.Take(ctx); err != nil {
			return throttle.Decision{}, err
		}
	}
	return allowed(true, p.limit), nil
}

// slotted returns slidingwindow.NewSlotted with k slots as a (limit,
// window) constructor.
func slotted(k int) func(int, time.Duration, ...throttle.Option) (*slidingwindow.Limiter, error) {
	return func(limit int, window time.Duration, opts ...throttle.Option) (*slidingwindow.Limiter, error) {
		return slidingwindow.NewSlotted(limit, window, k, opts...)
	}
}
