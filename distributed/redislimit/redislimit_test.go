package redislimit

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) {
	if burstChild() {
		return
	}
	os.Exit(testproc.ServerMain(m, redistest.EnvRequire, redistest.ErrNoServer, func() (func(), error) {
		srv, err := redistest.StartServer()
		if err != nil {
			return nil, err
		}
		// The examples cannot start a server themselves.
		os.Setenv("REDISLIMIT_EXAMPLE_ADDR", srv.Addr)
		return srv.Close, nil
	}))
}

var prefixSeq atomic.Int64

// newClient starts (or reuses) a server and returns a client for it that
// honours context deadlines, closed at the end of the test.
func newClient(t testing.TB, s *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr,
		ContextTimeoutEnabled: true,
		PoolSize:              64,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// uniquePrefix keeps tests apart on a shared external server.
func uniquePrefix() string {
	return fmt.Sprintf("test:%d:%d:", time.Now().UnixNano(), prefixSeq.Add(1))
}

// vclock injects virtual time, with a timeout generous enough for a
// loaded machine (fault tests set their own).
func vclock(clk *throttletest.Clock) Option {
	return func(c *config) {
		WithOptions(throttle.WithClock(clk))(c)
		WithTimeout(5 * time.Second)(c)
	}
}

// newLimiter makes a limiter on Redis with opts.
type newLimiter func(opts ...Option) (throttle.Limiter, error)

// suite is the conformance suite of the limiters newL makes, on virtual
// time and each under a prefix of its own, with Limit and Bound as in
// throttletest.Suite.
func suite(newL newLimiter, limit int, bound func(time.Duration) int64) throttletest.Suite {
	return throttletest.Suite{
		New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
			l, err := newL(vclock(clk), WithPrefix(uniquePrefix()))
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		Limit: limit,
		Bound: bound,
	}
}

// bucketSuite is the conformance suite of token buckets at 10/s, burst 5,
// on c.
func bucketSuite(c redis.UniversalClient) throttletest.Suite {
	rate, burst := throttle.PerSecond(10), 5
	return suite(func(o ...Option) (throttle.Limiter, error) { return NewTokenBucket(c, rate, burst, o...) },
		burst, func(d time.Duration) int64 { return int64(burst) + rate.Events(d) })
}

// TestSuites runs the conformance suite on every algorithm but
// concurrency (TestConcurrencySuite).
func TestSuites(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	leak, capacity := throttle.PerSecond(3), 4
	limit, window := 7, time.Second
	// limit for each window a span of d can touch.
	touched := func(d time.Duration) int64 { return int64(limit) * (int64((d+window-1)/window) + 1) }
	for _, tc := range []struct {
		name string
		s    throttletest.Suite
	}{
		{"TokenBucket", bucketSuite(c)},
		{"LeakyBucketMeter", suite(func(o ...Option) (throttle.Limiter, error) { return NewTokenBucket(c, leak, capacity, o...) },
			capacity, func(d time.Duration) int64 { return int64(capacity) + leak.Events(d) })},
		{"FixedWindow", suite(func(o ...Option) (throttle.Limiter, error) { return NewFixedWindow(c, limit, window, o...) },
			limit, touched)},
		{"SlidingWindow", suite(func(o ...Option) (throttle.Limiter, error) { return NewSlidingWindow(c, limit, window, o...) },
			limit, touched)},
		{"SlidingLog", suite(func(o ...Option) (throttle.Limiter, error) { return NewSlidingLog(c, limit, window, o...) },
			limit, func(d time.Duration) int64 { return int64(limit) * (int64(d/window) + 1) })},
	} {
		t.Run(tc.name, func(t *testing.T) { throttletest.Run(t, tc.s) })
	}
}

func TestEveryServerTime(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv)
	l, err := NewTokenBucket(c, throttle.Every(time.Hour), 1, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := l.Allow(ctx, "api", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("first = %+v, %v", d, err)
	}
	d, err = l.Allow(ctx, "api", 1)
	if err != nil || d.Allowed || d.RetryAfter < 59*time.Minute || d.RetryAfter > time.Hour {
		t.Fatalf("second = %+v, %v", d, err)
	}
	r, err := l.Reserve(ctx, "api", 1, 3*time.Hour)
	if err != nil || !r.OK || r.Delay < 59*time.Minute || r.Delay > time.Hour {
		t.Fatalf("reserve = %+v, %v", r, err)
	}
	r2, err := l.Reserve(ctx, "api", 1, 3*time.Hour)
	if err != nil || !r2.OK || r2.Delay-r.Delay < 59*time.Minute {
		t.Fatalf("reserve 2 = %+v, %v", r2, err)
	}
	r3, err := l.Reserve(ctx, "api", 1, 3*time.Hour)
	if err != nil || !r3.OK {
		t.Fatalf("reserve 3 = %+v, %v", r3, err)
	}
	// Three permits booked ahead: the fourth is beyond maxWait.
	r4, err := l.Reserve(ctx, "api", 1, 3*time.Hour)
	if err != nil || r4.OK || r4.Delay <= 0 {
		t.Fatalf("reserve 4 = %+v, %v", r4, err)
	}
}

func TestConcurrencySuite(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	limit := 6
	s := suite(func(o ...Option) (throttle.Limiter, error) { return NewConcurrency(c, limit, time.Minute, o...) }, limit, nil)
	s.Release = func(l throttle.Limiter, key string, n int) {
		if err := l.(*Concurrency).Release(context.Background(), key, n); err != nil {
			t.Fatal(err)
		}
	}
	throttletest.Run(t, s)
}

func TestConcurrencyLeases(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv)
	clk := throttletest.NewClock()
	prefix := uniquePrefix()
	mk := func() *Concurrency {
		l, err := NewConcurrency(c, 3, 10*time.Second, vclock(clk), WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	crashed, alive := mk(), mk()
	ctx := context.Background()
	if d, err := crashed.Allow(ctx, "db", 2); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("crashed holder: %+v, %v", d, err)
	}
	if d, err := alive.Allow(ctx, "db", 1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("alive holder: %+v, %v", d, err)
	}
	if d, _ := alive.Allow(ctx, "db", 1); d.Allowed {
		t.Fatal("admitted above the limit")
	}
	if err := alive.Release(ctx, "db", 2); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("releasing units of another holder: %v, want ErrInvalid", err)
	}
	clk.Advance(6 * time.Second)
	if n, err := alive.Extend(ctx, "db"); err != nil || n != 1 {
		t.Fatalf("Extend = %d, %v; want 1", n, err)
	}
	clk.Advance(5 * time.Second) // the crashed holder's leases ran out; alive's did not
	if d, err := alive.Allow(ctx, "db", 2); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the crashed holder's leases ran out: %+v, %v", d, err)
	}
	if err := alive.Release(ctx, "db", 3); err != nil {
		t.Fatal(err)
	}
	if d, _ := alive.Allow(ctx, "db", 3); !d.Allowed {
		t.Fatalf("after release: %+v", d)
	}
	clk.Advance(11 * time.Second)
	if n, err := alive.Extend(ctx, "db"); err != nil || n != 0 || alive.heldUnits("db") != 0 {
		t.Fatalf("Extend after the leases ran out = %d, %v (held %d); want 0", n, err, alive.heldUnits("db"))
	}
}

// TestLuaMulDiv checks the exact floor(a·b/c) of the sliding window
// script against math/big, near the ends of its range.
func TestLuaMulDiv(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	src, err := luaFS.ReadFile("lua/slidingwindow.lua")
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	fn := body[strings.Index(body, "local function muldiv"):strings.Index(body, "local W, L")]
	script := redis.NewScript(fn + "local q, r = muldiv(ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0)\nreturn {string.format('%d', q), string.format('%d', r)}")
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 3000 {
		a := rng.Int64N(1 << 24)
		cc := 1 + rng.Int64N(1<<52)
		b := 1 + rng.Int64N(cc) // b <= c, as in the script
		if i%3 == 0 {
			cc = 1 + rng.Int64N(1<<24) // the other shape: r·W/prev
			b = 1 + rng.Int64N(1<<52)
			a = rng.Int64N(cc)
		}
		v, err := script.Run(context.Background(), c, nil, a, b, cc).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		p := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
		q, r := new(big.Int).QuoRem(p, big.NewInt(cc), new(big.Int))
		if v[0] != q.String() || v[1] != r.String() {
			t.Fatalf("muldiv(%d, %d, %d) = %v, want %v %v", a, b, cc, v, q, r)
		}
	}
}
