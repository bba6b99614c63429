package redislimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// diffStarts are the instants the differential traces start at: the
// usual one, before 1970, across 1970 and late in the int64 range.
var diffStarts = []time.Time{
	throttletest.Epoch,
	time.Date(1960, 6, 1, 0, 0, 0, 0, time.UTC),
	time.Unix(-1, 0),
	time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC),
}

// newLocal makes a local limiter with opts.
type newLocal func(opts ...throttle.Option) (throttle.Limiter, error)

// differential drives the local and the Redis limiter (each made afresh
// per trace) with the same virtual-time trace (random gaps, sizes and
// keys) and requires identical decisions, field by field.
func differential(t *testing.T, limit int, newL newLocal, newR newLimiter) {
	t.Helper()
	ctx := context.Background()
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clk := throttletest.NewClock()
		clk.Set(diffStarts[seed])
		local, err := newL(throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		shared, err := newR(vclock(clk), WithPrefix(uniquePrefix()))
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "c"}
		maxGap := []int64{int64(time.Millisecond), int64(50 * time.Millisecond), int64(time.Second)}[seed%3]
		for i := range 1500 {
			if rng.IntN(4) != 0 {
				clk.Advance(time.Duration(rng.Int64N(maxGap)))
			}
			key := keys[rng.IntN(len(keys))]
			n := 1 + rng.IntN(min(limit, 3))
			want, err1 := local.Allow(ctx, key, n)
			got, err2 := shared.Allow(ctx, key, n)
			if err1 != nil || err2 != nil {
				t.Fatalf("seed %d step %d: errors %v / %v", seed, i, err1, err2)
			}
			if want != got {
				t.Fatalf("seed %d step %d key %s n %d at %v:\n local %+v\n redis %+v", seed, i, key, n,
					clk.Now(), want, got)
			}
		}
	}
}

func TestDifferentialTokenBucket(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	for _, tc := range []struct {
		rate  throttle.Rate
		burst int
	}{{throttle.PerSecond(10), 5}, {throttle.PerSecond(3), 4}, {throttle.NewRate(1, 100*time.Millisecond), 1},
		// The whole range: a huge burst at a high rate, and a span of maxSpan.
		{throttle.PerSecond(1_000_000_000), 1 << 30}, {throttle.NewRate(1, maxSpan/8), 8}} {
		differential(t, tc.burst,
			func(o ...throttle.Option) (throttle.Limiter, error) { return tokenbucket.New(tc.rate, tc.burst, o...) },
			func(o ...Option) (throttle.Limiter, error) { return NewTokenBucket(c, tc.rate, tc.burst, o...) })
	}
}

// windowCase is a limit and window of the window differentials.
type windowCase struct {
	limit int
	w     time.Duration
}

// windowCases are small windows that traces cross often, and the ends of
// the range.
var windowCases = []windowCase{{6, 100 * time.Millisecond}, {6, time.Second}, {6, 7 * time.Second / 3}, {6, maxWindow}, {1<<24 - 1, maxWindow}, {3, 3}}

// TestDifferentialWindows compares each window algorithm on Redis with
// the local one over windowCases, and the fixed window at the largest
// limit too.
func TestDifferentialWindows(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	for _, alg := range []struct {
		name   string
		local  func(limit int, w time.Duration, o ...throttle.Option) (throttle.Limiter, error)
		shared func(limit int, w time.Duration, o ...Option) (throttle.Limiter, error)
		extra  []windowCase
	}{
		{"FixedWindow", func(limit int, w time.Duration, o ...throttle.Option) (throttle.Limiter, error) {
			return fixedwindow.New(limit, w, o...)
		}, func(limit int, w time.Duration, o ...Option) (throttle.Limiter, error) {
			return NewFixedWindow(c, limit, w, o...)
		}, []windowCase{{1<<32 - 1, maxWindow}}},
		{"SlidingLog", func(limit int, w time.Duration, o ...throttle.Option) (throttle.Limiter, error) {
			return slidinglog.New(limit, w, o...)
		}, func(limit int, w time.Duration, o ...Option) (throttle.Limiter, error) {
			return NewSlidingLog(c, limit, w, o...)
		}, nil},
		{"SlidingWindow", func(limit int, w time.Duration, o ...throttle.Option) (throttle.Limiter, error) {
			return slidingwindow.New(limit, w, o...)
		}, func(limit int, w time.Duration, o ...Option) (throttle.Limiter, error) {
			return NewSlidingWindow(c, limit, w, o...)
		}, nil},
	} {
		t.Run(alg.name, func(t *testing.T) {
			for _, tc := range slices.Concat(windowCases, alg.extra) {
				differential(t, tc.limit,
					func(o ...throttle.Option) (throttle.Limiter, error) { return alg.local(tc.limit, tc.w, o...) },
					func(o ...Option) (throttle.Limiter, error) { return alg.shared(tc.limit, tc.w, o...) })
			}
		})
	}
}

func TestDifferentialConcurrency(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	clk := throttletest.NewClock()
	local, err := counting.New(5)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := NewConcurrency(c, 5, time.Hour, vclock(clk), WithPrefix(uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for i := range 2000 {
		key := []string{"a", "b"}[rng.IntN(2)]
		if h := held[key]; h > 0 && rng.IntN(3) == 0 {
			n := 1 + rng.IntN(h)
			if err1, err2 := local.Release(key, n), shared.Release(ctx, key, n); err1 != nil || err2 != nil {
				t.Fatalf("step %d: release errors %v / %v", i, err1, err2)
			}
			held[key] -= n
			continue
		}
		n := 1 + rng.IntN(3)
		want, err1 := local.Allow(ctx, key, n)
		got, err2 := shared.Allow(ctx, key, n)
		if err1 != nil || err2 != nil || want != got {
			t.Fatalf("step %d key %s n %d: local %+v %v, redis %+v %v", i, key, n, want, err1, got, err2)
		}
		if got.Allowed {
			held[key] += n
		}
	}
}

func TestDifferentialLeakyBucket(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	differential(t, 4,
		func(o ...throttle.Option) (throttle.Limiter, error) {
			return leakybucket.New(throttle.PerSecond(7), 4, o...)
		},
		func(o ...Option) (throttle.Limiter, error) { return NewTokenBucket(c, throttle.PerSecond(7), 4, o...) })
}

// TestDifferentialReserve compares reservations (the "once every d"
// optimistic mode) with the local token bucket, including Cancel.
func TestDifferentialReserve(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	ctx := context.Background()
	clk := throttletest.NewClock()
	local, err := tokenbucket.New(throttle.NewRate(1, time.Second), 1, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := NewTokenBucket(c, throttle.NewRate(1, time.Second), 1, vclock(clk), WithPrefix(uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var lres, rres []throttle.Reservation
	for i := range 500 {
		clk.Advance(time.Duration(rng.Int64N(int64(700 * time.Millisecond))))
		if len(lres) > 0 && rng.IntN(4) == 0 {
			j := rng.IntN(len(lres))
			lres[j].Cancel()
			rres[j].Cancel()
			continue
		}
		maxWait := time.Duration(rng.Int64N(int64(5 * time.Second)))
		want, err1 := local.Reserve(ctx, "api", 1, maxWait)
		got, err2 := shared.Reserve(ctx, "api", 1, maxWait)
		if err1 != nil || err2 != nil || want.OK != got.OK || want.Delay != got.Delay || want.Limit != got.Limit {
			t.Fatalf("step %d maxWait %v: local %+v %v, redis %+v %v", i, maxWait, want, err1, got, err2)
		}
		if got.OK {
			lres, rres = append(lres, want), append(rres, got)
		}
	}
}

// TestFixedWindowClockStepsBack: a clock stepped back into the previous
// window (failover to a node whose clock is behind) and forward again
// admits 10, 0, 0 at 10 per minute, as the local fixed window does; the
// script used to restart the window each time (10, 10, 10).
func TestFixedWindowClockStepsBack(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	clk := throttletest.NewClock()
	clk.Advance(20 * time.Second)
	local, err := fixedwindow.New(10, time.Minute, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := NewFixedWindow(c, 10, time.Minute, vclock(clk), WithPrefix(uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []time.Duration{0, -31 * time.Second, 32 * time.Second} {
		clk.Advance(step)
		var got, want int
		for range 12 {
			if d, err := shared.Allow(t.Context(), "k", 1); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				got++
			}
			if d, _ := local.Allow(t.Context(), "k", 1); d.Allowed {
				want++
			}
		}
		if got != want || want != []int{10, 0, 0}[i] {
			t.Errorf("phase %d: Redis admitted %d, local %d; want 10, 0, 0", i, got, want)
		}
	}
}

// TestBucketSpanEdge: a bucket spanning maxSpan decides exactly as the
// local one (debts near 2^53 ns used to come back rounded, or as a
// non-integer PX beyond 2^59 that failed the call), and a longer span is
// refused at construction.
func TestBucketSpanEdge(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	if _, err := NewTokenBucket(c, throttle.NewRate(1, maxSpan+4), 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("span above maxSpan: %v, want an error wrapping ErrInvalid", err)
	}
	if _, err := NewTokenBucket(c, throttle.NewRate(1, 366*24*time.Hour), 36); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("36 per 366 days: %v, want an error wrapping ErrInvalid", err)
	}
	rate := throttle.NewRate(1, maxSpan/4)
	differential(t, 4,
		func(o ...throttle.Option) (throttle.Limiter, error) { return tokenbucket.New(rate, 4, o...) },
		func(o ...Option) (throttle.Limiter, error) { return NewTokenBucket(c, rate, 4, o...) })
}

// quotaAdapter calls AllowQuota with a tier per key: what httplimit and
// rules do with a QuotaAllower.
type quotaAdapter struct{ q throttle.QuotaAllower }

func (a quotaAdapter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	rate, burst := throttle.PerSecond(5), 3 // free
	if key == "b" {
		rate, burst = throttle.PerSecond(50), 6 // pro
	}
	return a.q.AllowQuota(ctx, key, n, rate, burst)
}

// TestDifferentialAllowQuota: per-call limits (tiers) decide on Redis as
// tokenbucket.Limiter.AllowQuota does, and Quota states the bucket's.
func TestDifferentialAllowQuota(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	differential(t, 3,
		func(o ...throttle.Option) (throttle.Limiter, error) {
			l, err := tokenbucket.New(throttle.PerSecond(1), 1, o...)
			return quotaAdapter{l}, err
		},
		func(o ...Option) (throttle.Limiter, error) {
			r, err := NewTokenBucket(c, throttle.PerSecond(1), 1, o...)
			return quotaAdapter{r}, err
		})
	r, err := NewTokenBucket(c, throttle.PerSecond(10), 20)
	if err != nil {
		t.Fatal(err)
	}
	if q := r.Quota(); q != (throttle.Quota{Limit: 20, Window: 2 * time.Second}) {
		t.Errorf("Quota = %+v, want 20 per 2s", q)
	}
	if _, err := r.AllowQuota(t.Context(), "k", 4, throttle.PerSecond(1), 3); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("AllowQuota(n > burst) = %v, want ErrExceedsLimit", err)
	}
	if _, err := r.AllowQuota(t.Context(), "k", 1, throttle.NewRate(1, maxSpan), 2); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("AllowQuota above maxSpan = %v, want ErrInvalid", err)
	}
}

// TestServerClockBounds runs every algorithm in the server-clock mode (the
// scripts read Redis's TIME; no injected clock) for 600 ms of real time,
// 4 goroutines asking without pause, and checks what each admitted against
// its bound and against what the rate makes certain: the mode the other
// tests, on virtual time, do not reach.
func TestServerClockBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	c := newClient(t, redistest.Start(t))
	// A call waits up to 5 s: the bounds are about the server's clock, and
	// the default 100 ms timeout fails calls on a loaded machine.
	const run = 600 * time.Millisecond
	rate := throttle.PerSecond(100) // 10 per 100 ms
	mk := func(l throttle.Limiter, err error) throttle.Limiter {
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for name, tc := range map[string]struct {
		l      throttle.Limiter
		lo, hi func(d time.Duration) int64
	}{
		"token bucket": {mk(NewTokenBucket(c, rate, 10, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second))),
			func(d time.Duration) int64 { return rate.Events(d) - 2 }, func(d time.Duration) int64 { return 10 + rate.Events(d) }},
		"fixed window": {mk(NewFixedWindow(c, 10, 100*time.Millisecond, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second))),
			func(d time.Duration) int64 { return 10 * int64(d/(100*time.Millisecond)) }, func(d time.Duration) int64 { return 10 * (int64(d/(100*time.Millisecond)) + 1) }},
		"sliding window": {mk(NewSlidingWindow(c, 10, 100*time.Millisecond, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second))),
			func(d time.Duration) int64 { return 10*int64(d/(100*time.Millisecond)) - 10 }, func(d time.Duration) int64 { return 10 * (int64(d/(100*time.Millisecond)) + 2) }},
		"sliding log": {mk(NewSlidingLog(c, 10, 100*time.Millisecond, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second))),
			func(d time.Duration) int64 { return 10 * int64(d/(100*time.Millisecond)) }, func(d time.Duration) int64 { return 10 * (int64(d/(100*time.Millisecond)) + 1) }},
	} {
		var admitted atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for time.Since(start) < run {
					if d, err := tc.l.Allow(t.Context(), "k", 1); err != nil {
						t.Error(err)
						return
					} else if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		// The server's clock ran at least run and at most el during the
		// calls (plus a round trip either side).
		if n := admitted.Load(); n < tc.lo(run-5*time.Millisecond) || n > tc.hi(el+5*time.Millisecond) {
			t.Errorf("%s: admitted %d in %v of real time, want [%d, %d]", name, n, el, tc.lo(run-5*time.Millisecond), tc.hi(el+5*time.Millisecond))
		}
	}
}
