package benchmarks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	rlsw "github.com/RussellLuo/slidingwindow"
	"github.com/go-chi/httprate"
	jujurate "github.com/juju/ratelimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	uber "go.uber.org/ratelimit"
	xrate "golang.org/x/time/rate"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// errUnweighted is returned by adapters of peers that cannot charge n > 1.
var errUnweighted = errors.New("peer cannot charge more than one unit per call")

// maxKeys is the bound on tracked keys given to peers that take one, the
// same as this module's default.
const maxKeys = limiterkit.DefaultMaxKeys

// peers are the other libraries, each adapted to throttle.Limiter as
// thinly as their API allows.
var peers = []Subject{
	{
		Name: "x/time/rate", Algo: "token bucket",
		VirtualTime: true, Weighted: true,
		Note: "float tokens; a call whose clock read is older than the last one moves the limiter's clock back and earns that time again (stale reads trace; golang/go#65508)",
		New:  newXRate,
	},
	{
		Name: "x/time/rate+sync.Map", Algo: "token bucket",
		Keyed: true, VirtualTime: true, Weighted: true,
		Note: "one rate.Limiter per key in a sync.Map (the usual do-it-yourself keyed limiter); never forgets a key",
		New:  newXRateKeyed,
	},
	{
		Name: "uber/ratelimit", Algo: "leaky bucket (pacer)",
		Blocks: true,
		Note:   "Take blocks until the next slot: there is no denied path; slack of 10 by default",
		New:    newUber,
	},
	{
		Name: "juju/ratelimit", Algo: "token bucket",
		VirtualTime: true, Weighted: true,
		Note: "float rate; TakeAvailable(1) for n = 1, TakeMaxDuration(n, 0) for n > 1",
		New:  newJuju,
	},
	{
		Name: "go-limiter", Algo: "token bucket (interval refill)",
		Keyed: true,
		Note: "refills once per Interval, counted from the key's first use, and then only min(Tokens, Interval in ns / Tokens) tokens; n = 1 only. " +
			"Its one-key allowed-path speed runs use 1e9 tokens per 1e18 ns (no refill during the run): 1e6 per 10 ms would refill 10 tokens per interval and put it on the denied path",
		SpeedConfig: func(c Config) Config { c.Limit, c.Window = 1_000_000_000, 1_000_000_000_000_000_000; return c },
		New:         newGoLimiter,
	},
	{
		Name: "throttled GCRA", Algo: "GCRA",
		Keyed: true, VirtualTime: true, Weighted: true,
		Note: "memstore with an LRU of 1<<20 keys; after 10 failed compare-and-swaps on a contended key it returns an error (counted as a denial and as an error)",
		New:  newThrottled,
	},
	{
		Name: "ulule/limiter", Algo: "fixed window (anchored)",
		Keyed: true, Weighted: true,
		Note: "window starts at the key's first request after the last one expired; every call is counted, denied ones too (n included)",
		New:  newUlule,
	},
	{
		Name: "RussellLuo/slidingwindow", Algo: "sliding window counter",
		VirtualTime: true, Weighted: true,
		Note: "windows aligned to multiples of the window since the zero time; one mutex",
		New:  newRLSlidingWindow,
	},
	{
		Name: "go-chi/httprate", Algo: "sliding window counter",
		Keyed: true, Weighted: true,
		Note: "one mutex for all keys; keys are hashed to 64 bits (collisions share a limit); HTTP response headers disabled",
		New:  newHTTPRate,
	},
}

// --- golang.org/x/time/rate

type xrateLimiter struct {
	l     *xrate.Limiter
	clock throttle.Clock
	limit int
}

func newXRate(c Config) (throttle.Limiter, error) {
	return &xrateLimiter{l: xrate.NewLimiter(xrate.Limit(c.PerSecond()), c.Limit), clock: c.Clock, limit: c.Limit}, nil
}

func (x *xrateLimiter) Allow(_ context.Context, _ string, n int) (throttle.Decision, error) {
	if x.clock == nil {
		if n == 1 {
			return allowed(x.l.Allow(), x.limit), nil
		}
		return allowed(x.l.AllowN(time.Now(), n), x.limit), nil
	}
	return allowed(x.l.AllowN(x.clock.Now(), n), x.limit), nil
}

type xrateKeyed struct {
	m     sync.Map
	c     Config
	limit xrate.Limit
}

func newXRateKeyed(c Config) (throttle.Limiter, error) {
	return &xrateKeyed{c: c, limit: xrate.Limit(c.PerSecond())}, nil
}

func (x *xrateKeyed) Allow(_ context.Context, key string, n int) (throttle.Decision, error) {
	v, ok := x.m.Load(key)
	if !ok {
		v, _ = x.m.LoadOrStore(key, xrate.NewLimiter(x.limit, x.c.Limit))
	}
	l := v.(*xrate.Limiter)
	if x.c.Clock == nil {
		return allowed(l.AllowN(time.Now(), n), x.c.Limit), nil
	}
	return allowed(l.AllowN(x.c.Clock.Now(), n), x.c.Limit), nil
}

// --- go.uber.org/ratelimit

type uberLimiter struct {
	l     uber.Limiter
	limit int
}

func newUber(c Config) (throttle.Limiter, error) {
	return &uberLimiter{l: uber.New(c.Limit, uber.Per(c.Window)), limit: c.Limit}, nil
}

func (u *uberLimiter) Allow(_ context.Context, _ string, n int) (throttle.Decision, error) {
	for range n {
		u.l.Take()
	}
	return allowed(true, u.limit), nil
}

// --- github.com/juju/ratelimit

type jujuClock struct{ c throttle.Clock }

func (j jujuClock) Now() time.Time { return j.c.Now() }

// Sleep is never called: the adapter only uses the non-blocking methods.
func (jujuClock) Sleep(time.Duration) { panic("juju/ratelimit: unexpected Sleep") }

type jujuLimiter struct {
	b     *jujurate.Bucket
	limit int
}

func newJuju(c Config) (throttle.Limiter, error) {
	var b *jujurate.Bucket
	if c.Clock == nil {
		b = jujurate.NewBucketWithRate(c.PerSecond(), int64(c.Limit))
	} else {
		b = jujurate.NewBucketWithRateAndClock(c.PerSecond(), int64(c.Limit), jujuClock{c.Clock})
	}
	return &jujuLimiter{b: b, limit: c.Limit}, nil
}

func (j *jujuLimiter) Allow(_ context.Context, _ string, n int) (throttle.Decision, error) {
	if n == 1 {
		return allowed(j.b.TakeAvailable(1) == 1, j.limit), nil
	}
	_, ok := j.b.TakeMaxDuration(int64(n), 0)
	return allowed(ok, j.limit), nil
}

// --- github.com/sethvargo/go-limiter

type goLimiter struct {
	s interface {
		Take(ctx context.Context, key string) (tokens, remaining, reset uint64, ok bool, err error)
		Close(ctx context.Context) error
	}
	limit int
}

func newGoLimiter(c Config) (throttle.Limiter, error) {
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(c.Limit), Interval: c.Window})
	if err != nil {
		return nil, err
	}
	return &goLimiter{s: s, limit: c.Limit}, nil
}

func (g *goLimiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if n != 1 {
		return throttle.Decision{}, errUnweighted
	}
	_, _, _, ok, err := g.s.Take(ctx, key)
	return allowed(ok, g.limit), err
}

func (g *goLimiter) Close() error { return g.s.Close(bg) }

// --- github.com/throttled/throttled/v2

type throttledLimiter struct {
	l     *throttled.GCRARateLimiterCtx
	limit int
}

func newThrottled(c Config) (throttle.Limiter, error) {
	st, err := memstore.New(maxKeys)
	if err != nil {
		return nil, err
	}
	if c.Clock != nil {
		st.SetTimeNow(c.Clock.Now)
	}
	q := throttled.RateQuota{MaxRate: throttled.PerDuration(c.Limit, c.Window), MaxBurst: c.Limit - 1}
	l, err := throttled.NewGCRARateLimiterCtx(throttled.WrapStoreWithContext(st), q)
	if err != nil {
		return nil, err
	}
	return &throttledLimiter{l: l, limit: c.Limit}, nil
}

func (t *throttledLimiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	limited, _, err := t.l.RateLimitCtx(ctx, key, n)
	return allowed(!limited && err == nil, t.limit), err
}

// --- github.com/ulule/limiter/v3

type ululeLimiter struct {
	l     *ulule.Limiter
	limit int
}

func newUlule(c Config) (throttle.Limiter, error) {
	return &ululeLimiter{l: ulule.New(ululemem.NewStore(), ulule.Rate{Period: c.Window, Limit: int64(c.Limit)}), limit: c.Limit}, nil
}

func (u *ululeLimiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	var (
		lc  ulule.Context
		err error
	)
	if n == 1 {
		lc, err = u.l.Get(ctx, key)
	} else {
		lc, err = u.l.Increment(ctx, key, int64(n))
	}
	return allowed(err == nil && !lc.Reached, u.limit), err
}

// --- github.com/RussellLuo/slidingwindow

type rlSlidingWindow struct {
	l     *rlsw.Limiter
	stop  rlsw.StopFunc
	clock throttle.Clock
	limit int
}

func newRLSlidingWindow(c Config) (throttle.Limiter, error) {
	l, stop := rlsw.NewLimiter(c.Window, int64(c.Limit), func() (rlsw.Window, rlsw.StopFunc) { return rlsw.NewLocalWindow() })
	return &rlSlidingWindow{l: l, stop: stop, clock: c.Clock, limit: c.Limit}, nil
}

func (r *rlSlidingWindow) Allow(_ context.Context, _ string, n int) (throttle.Decision, error) {
	now := time.Now()
	if r.clock != nil {
		now = r.clock.Now()
	}
	return allowed(r.l.AllowN(now, int64(n)), r.limit), nil
}

func (r *rlSlidingWindow) Close() { r.stop() }

// --- github.com/go-chi/httprate

type httprateLimiter struct {
	l     *httprate.RateLimiter
	w     nopWriter
	r     *http.Request
	limit int
}

// nopWriter is the ResponseWriter handed to httprate; with its headers
// disabled it is never written to.
type nopWriter struct{ h http.Header }

func (w nopWriter) Header() http.Header       { return w.h }
func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriter) WriteHeader(int)             {}

func newHTTPRate(c Config) (throttle.Limiter, error) {
	return &httprateLimiter{
		l:     httprate.NewRateLimiter(c.Limit, c.Window, httprate.WithResponseHeaders(httprate.ResponseHeaders{})),
		w:     nopWriter{h: http.Header{}},
		r:     httptest.NewRequest(http.MethodGet, "/", nil),
		limit: c.Limit,
	}, nil
}

func (h *httprateLimiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	r := h.r
	if n != 1 {
		r = r.WithContext(httprate.WithIncrement(ctx, n))
	}
	return allowed(!h.l.OnLimit(h.w, r, key), h.limit), nil
}
