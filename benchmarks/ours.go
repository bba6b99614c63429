package benchmarks

import (
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/tokenbucket"
)

// ours are this module's algorithms, one line each. Single-resource types
// ignore the key; keyed ones run the many-key workloads too.
var ours = []Subject{
	{Name: "tokenbucket.Bucket", Ours: true, Algo: "token bucket (GCRA)", VirtualTime: true, Weighted: true, New: rateBurst(tokenbucket.NewBucket)},
	{Name: "tokenbucket.Limiter", Ours: true, Algo: "token bucket (GCRA)", Keyed: true, VirtualTime: true, Weighted: true, New: rateBurst(tokenbucket.New)},
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
