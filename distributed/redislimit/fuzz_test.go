package redislimit

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// FuzzDifferential drives a local limiter and its Redis twin with the
// same fuzzed virtual-time trace (gaps from nanoseconds to days, so the
// scripts' relative arithmetic is exercised far from the reference) and
// requires identical decisions: hence never more than the local bound,
// and no error or panic.
func FuzzDifferential(f *testing.F) {
	addr := os.Getenv("REDISLIMIT_EXAMPLE_ADDR")
	if addr == "" {
		f.Skip("no redis-server (see TestMain)")
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	f.Add(byte(0), byte(3), byte(2), []byte{1, 2, 3, 200, 1, 0, 90, 2, 1})
	f.Add(byte(1), byte(7), byte(5), []byte{255, 3, 1, 0, 1, 0, 17, 2, 2})
	f.Add(byte(2), byte(1), byte(9), []byte{40, 1, 1, 41, 1, 0, 42, 1, 1, 250, 1, 0})
	f.Fuzz(func(t *testing.T, alg, p1, p2 byte, trace []byte) { fuzzOne(t, c, alg, p1, p2, trace) })
}

func fuzzOne(t *testing.T, c *redis.Client, alg, p1, p2 byte, trace []byte) (steps int) {
	{
		if len(trace) > 300 {
			trace = trace[:300]
		}
		clk := throttletest.NewClock()
		opts := []Option{vclock(clk), WithPrefix(uniquePrefix())}
		limit := 1 + int(p1%10)
		var local, shared throttle.Limiter
		var err1, err2 error
		switch alg % 4 {
		case 0:
			rate := throttle.NewRate(1+int(p2), time.Duration(1+int(p1)*int(p2))*time.Millisecond)
			local, err1 = tokenbucket.New(rate, limit, throttle.WithClock(clk))
			shared, err2 = NewTokenBucket(c, rate, limit, opts...)
		case 1:
			w := time.Duration(1+int(p2)*int(p2)) * time.Millisecond / 7
			local, err1 = fixedwindow.New(limit, w, throttle.WithClock(clk))
			shared, err2 = NewFixedWindow(c, limit, w, opts...)
		case 3:
			w := time.Duration(1+int(p2)*int(p2)) * time.Millisecond / 3
			local, err1 = slidingwindow.New(limit, w, throttle.WithClock(clk))
			shared, err2 = NewSlidingWindow(c, limit, w, opts...)
		default:
			w := time.Duration(1+int(p2)) * 3 * time.Millisecond
			local, err1 = slidinglog.New(limit, w, throttle.WithClock(clk))
			shared, err2 = NewSlidingLog(c, limit, w, opts...)
		}
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("constructors disagree: local %v, redis %v", err1, err2)
		}
		if err1 != nil {
			return
		}
		ctx := context.Background()
		for i := 0; i+2 < len(trace); i += 3 {
			// A gap of mantissa · 64^exponent nanoseconds: 0 to ~days.
			gap := time.Duration(trace[i]&31) << (3 * (trace[i] >> 5) * 2)
			clk.Advance(gap)
			n := 1 + int(trace[i+1])%limit
			key := string('a' + rune(trace[i+2]%3))
			steps++
			want, e1 := local.Allow(ctx, key, n)
			got, e2 := shared.Allow(ctx, key, n)
			if e1 != nil || e2 != nil || want != got {
				t.Fatalf("alg %d p1 %d p2 %d step %d (gap %v, n %d, key %s): local %+v %v, redis %+v %v", alg%4, p1, p2, i/3, gap, n, key, want, e1, got, e2)
			}
		}
	}
	return steps
}

// TestFuzzRandom runs the fuzz body on random inputs, as a plain test.
func TestFuzzRandom(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	rng := rand.New(rand.NewPCG(9, 9))
	steps := 0
	defer func() { t.Logf("%d steps", steps) }()
	for range 300 {
		trace := make([]byte, 3*(1+rng.IntN(60)))
		for i := range trace {
			trace[i] = byte(rng.IntN(256))
		}
		steps += fuzzOne(t, c, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), trace)
	}
}
