// Package storetest is the conformance test of a storelimit.Store: it runs
// every Algorithm of this module through a storelimit.Limiter over the
// store, against throttletest's suite, against the in-process limiter of
// the same algorithm on one random trace and clock (the same decisions,
// step for step), and with many goroutines on one key.
package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Config describes the store under test.
type Config struct {
	// New returns an empty store, reached by a new connection if it has
	// one. It is called once per sub-test.
	New func(t testing.TB) storelimit.Store
	// Steps is the length of each differential trace (3000 if 0).
	Steps int
	// Workers is how many goroutines Contention runs on one key (32 if 0).
	Workers int
	// NoBound skips the suite's random-trace bound check, which makes
	// thousands of decisions: for a store whose round trips make it slow.
	// The differential trace still covers the bound (the same decisions as
	// the in-process limiter, which passes it).
	NoBound bool
}

// testCase is one algorithm of the module with its in-process limiter.
type testCase struct {
	Name      string
	Limit     int
	Algorithm storelimit.Algorithm
	// Local returns the in-process limiter deciding as Algorithm.
	Local func(clk throttle.Clock) (throttle.Limiter, error)
	// Bound is the suite's bound (see throttletest.Suite).
	Bound func(d time.Duration) int64
}

// cases returns every Algorithm of the module: token bucket, leaky bucket
// (meter), fixed window aligned and anchored, weighted sliding window.
func cases(t testing.TB) []testCase {
	t.Helper()
	rate, burst, w, limit := throttle.PerSecond(10), 5, 1500*time.Millisecond, 7
	bucket := func(d time.Duration) int64 { return int64(burst) + rate.Events(d) }
	windows := func(d time.Duration) int64 { return int64(limit) * (int64((d+w-1)/w) + 1) }
	must := func(a storelimit.Algorithm, err error) storelimit.Algorithm {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	return []testCase{
		{"tokenbucket", burst, must(tokenbucket.NewAlgorithm(rate, burst)), func(c throttle.Clock) (throttle.Limiter, error) {
			return tokenbucket.New(rate, burst, throttle.WithClock(c))
		}, bucket},
		{"leakybucket", burst, must(leakybucket.NewAlgorithm(rate, burst)), func(c throttle.Clock) (throttle.Limiter, error) {
			return leakybucket.New(rate, burst, throttle.WithClock(c))
		}, bucket},
		{"fixedwindow", limit, must(fixedwindow.NewAlgorithm(limit, w, false)), func(c throttle.Clock) (throttle.Limiter, error) {
			return fixedwindow.New(limit, w, throttle.WithClock(c))
		}, windows},
		{"fixedwindow-anchored", limit, must(fixedwindow.NewAlgorithm(limit, w, true)), func(c throttle.Clock) (throttle.Limiter, error) {
			return fixedwindow.NewAnchored(limit, w, throttle.WithClock(c))
		}, windows},
		{"slidingwindow", limit, must(slidingwindow.NewAlgorithm(limit, w)), func(c throttle.Clock) (throttle.Limiter, error) {
			return slidingwindow.New(limit, w, throttle.WithClock(c))
		}, windows},
	}
}

// Run runs the conformance test of the store c.New makes.
func Run(t *testing.T, c Config) {
	t.Helper()
	if c.Steps == 0 {
		c.Steps = 3000
	}
	if c.Workers == 0 {
		c.Workers = 32
	}
	for _, k := range cases(t) {
		if c.NoBound {
			k.Bound = nil
		}
		t.Run(k.Name, func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
					return NewLimiter(t, c.New(t), k.Algorithm, clk)
				},
				Limit: k.Limit,
				Bound: k.Bound,
			})
			t.Run("Differential", func(t *testing.T) {
				clk := throttletest.NewClock()
				local, err := k.Local(clk)
				if err != nil {
					t.Fatal(err)
				}
				if c, ok := local.(interface{ Close() error }); ok {
					defer c.Close()
				}
				throttletest.Differential(t, clk, local, NewLimiter(t, c.New(t), k.Algorithm, clk), k.Limit, c.Steps)
			})
			t.Run("Contention", func(t *testing.T) {
				Contention(t, NewLimiter(t, c.New(t), k.Algorithm, throttletest.NewClock()), k.Limit, c.Workers)
			})
		})
	}
}

// NewLimiter returns a storelimit.Limiter deciding with a over s on clk.
func NewLimiter(t testing.TB, s storelimit.Store, a storelimit.Algorithm, clk throttle.Clock) *storelimit.Limiter {
	t.Helper()
	l, err := storelimit.New(s, a, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Contention starts workers goroutines together on one key of a limiter
// of the given limit while time stands still, each asking until it is
// denied: exactly limit units are admitted in all (none lost to a write
// that raced another, none counted twice), and no call fails.
func Contention(t *testing.T, l throttle.Limiter, limit, workers int) {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			for {
				d, err := l.Allow(context.Background(), "hot", 1)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if !d.Allowed {
					return
				}
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := admitted.Load(); got != int64(limit) {
		t.Fatalf("%d goroutines on one key admitted %d units with time standing still, want exactly %d", workers, got, limit)
	}
}

// Counted returns s counting the calls made to it into calls (a batch of
// swaps is one call): a storelimit.BatchStore if s is one, else a
// storelimit.LoadingStore if s is one, else a storelimit.Store.
func Counted(s storelimit.Store, calls *atomic.Int64) storelimit.Store {
	c := counted{s, calls}
	if bs, ok := s.(storelimit.BatchStore); ok {
		return countedBatch{countedLoading{c, bs}, bs}
	}
	if ls, ok := s.(storelimit.LoadingStore); ok {
		return countedLoading{c, ls}
	}
	return c
}

type counted struct {
	s     storelimit.Store
	calls *atomic.Int64
}

func (c counted) Load(ctx context.Context, key string, now int64) (int64, error) {
	c.calls.Add(1)
	return c.s.Load(ctx, key, now)
}

func (c counted) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	c.calls.Add(1)
	return c.s.CompareAndSwap(ctx, key, old, next, now, expires)
}

type countedLoading struct {
	counted
	ls storelimit.LoadingStore
}

func (c countedLoading) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	c.calls.Add(1)
	return c.ls.CompareAndSwapLoad(ctx, key, old, next, now, expires)
}

type countedBatch struct {
	countedLoading
	bs storelimit.BatchStore
}

func (c countedBatch) CompareAndSwapBatch(ctx context.Context, swaps []storelimit.Swap) error {
	c.calls.Add(1)
	return c.bs.CompareAndSwapBatch(ctx, swaps)
}
