package redislimit

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	iwindow "github.com/throttlekit/throttle/internal/window"
)

// maxWindow is the longest window of NewFixedWindow, NewSlidingWindow
// and NewSlidingLog, and the longest lease of NewConcurrency.
// Scripts compute in Lua numbers (doubles), exact to the nanosecond up to
// 2^53 ns; windows up to maxWindow keep every offset below that.
const maxWindow = 52 * 24 * time.Hour

// FixedWindow is fixedwindow.Limiter with its state in Redis: up to limit
// units per key in each window aligned to the Unix epoch, shared by every
// process using the same Redis server and prefix. It has the same
// decisions as fixedwindow.New for the same trace, a clock stepped back
// included.
//
// A FixedWindow is safe for concurrent use. The zero value is not usable;
// call NewFixedWindow.
type FixedWindow struct{ windowed }

// SlidingLog is slidinglog.Limiter with its state in Redis: at most limit
// units per key in any half-open interval of length window, exactly,
// shared by every process using the same Redis server and prefix. It has
// the same decisions as slidinglog.New for the same trace.
//
// A SlidingLog is safe for concurrent use. The zero value is not usable;
// call NewSlidingLog.
type SlidingLog struct{ windowed }

// windowed is what the window limiters share: the core and the window,
// and for windows aligned to the Unix epoch the skew of their state.
type windowed struct {
	*core
	window int64
	skew   int64 // see window.Layout.Skew
}

var (
	_ throttle.Limiter       = (*FixedWindow)(nil)
	_ throttle.QuotaReporter = (*FixedWindow)(nil)
	_ throttle.Limiter       = (*SlidingLog)(nil)
	_ throttle.QuotaReporter = (*SlidingLog)(nil)
)

// Quota reports the limit per window.
func (l *windowed) Quota() throttle.Quota {
	return throttle.Quota{Limit: l.limit, Window: time.Duration(l.window)}
}

// newWindowed returns the core of a window limiter of algorithm alg. With
// counts > 0 its windows are aligned to the epoch, each state word
// holding counts counts.
func newWindowed(client redis.UniversalClient, alg string, limit int, window time.Duration, counts uint, opts []Option) (windowed, error) {
	switch {
	case limit <= 0 || limit > 1<<32-1:
		return windowed{}, fmt.Errorf("%w: limit %d out of range [1, %d]", throttle.ErrInvalid, limit, 1<<32-1)
	case window <= 0 || window > maxWindow:
		return windowed{}, fmt.Errorf("%w: window %v out of range (0, %v]", throttle.ErrInvalid, window, maxWindow)
	}
	c, _, err := newCore(client, alg, fmt.Sprintf("%d,%v", limit, window), limit, opts)
	if err != nil {
		return windowed{}, err
	}
	w := windowed{core: c, window: int64(window)}
	if counts > 0 {
		lay, _ := iwindow.NewLayout(int64(limit), counts)
		w.skew = lay.Skew(w.window)
	}
	return w, nil
}

// runAligned runs script, the decision of n units for key in aligned
// windows, and returns its reply.
func (l *windowed) runAligned(ctx context.Context, script *luaScript, key string, n int) ([]any, error) {
	ref, mode := l.now()
	var buf [10]any
	args := append(l.common(buf[:0], ref, mode), l.window, l.limit, n, floorMod(ref, l.window), l.skew)
	return l.run(ctx, script, []string{l.prefix + key}, args)
}

// NewFixedWindow returns a fixed-window limiter, as fixedwindow.New: up to
// limit units per window, windows aligned to multiples of window since the
// Unix epoch, on the server's clock (or the injected one). Errors wrap
// throttle.ErrInvalid.
func NewFixedWindow(client redis.UniversalClient, limit int, window time.Duration, opts ...Option) (*FixedWindow, error) {
	w, err := newWindowed(client, "fw", limit, window, 1, opts)
	if err != nil {
		return nil, err
	}
	return &FixedWindow{w}, nil
}

// NewSlidingLog returns a sliding log, as slidinglog.New: at most limit
// units in any half-open interval of length window, exactly. A key holds
// one list entry per distinct nanosecond admitted in the last window (at
// most limit entries) in two Redis keys that share a hash tag, so one
// Cluster slot. Errors wrap throttle.ErrInvalid.
func NewSlidingLog(client redis.UniversalClient, limit int, window time.Duration, opts ...Option) (*SlidingLog, error) {
	w, err := newWindowed(client, "sl", limit, window, 0, opts)
	if err != nil {
		return nil, err
	}
	return &SlidingLog{w}, nil
}

// Allow admits n units for key now or denies them, in one round trip.
func (l *FixedWindow) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return l.allowWith(ctx, key, n, l.allow)
}

func (l *FixedWindow) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	r, err := l.runAligned(ctx, fixedWindowScript, key, n)
	if err != nil {
		return l.fail(ctx, key, n, err)
	}
	d := throttle.Decision{Allowed: integer(r[0]) == 1, Limit: l.limit, Remaining: l.limit - int(integer(r[1]))}
	d.ResetAfter = time.Duration(integer(r[2]))
	if !d.Allowed {
		d.RetryAfter = d.ResetAfter
	}
	return d, nil
}

// Allow admits n units for key now or denies them, in one round trip.
func (l *SlidingLog) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return l.allowWith(ctx, key, n, l.allow)
}

func (l *SlidingLog) allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	ref, mode := l.now()
	var buf [8]any
	args := append(l.common(buf[:0], ref, mode), l.window, l.limit, n)
	tag := logTag(l.prefix, key)
	r, err := l.run(ctx, slidingLogScript, []string{tag + ":log", tag + ":meta"}, args)
	if err != nil {
		return l.fail(ctx, key, n, err)
	}
	d := throttle.Decision{Allowed: integer(r[0]) == 1, Limit: l.limit, Remaining: l.limit - int(integer(r[1]))}
	if d.Allowed {
		d.ResetAfter = time.Duration(integer(r[2]))
	} else {
		d.RetryAfter, d.ResetAfter = time.Duration(integer(r[2])), time.Duration(integer(r[3]))
	}
	return d, nil
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// logTag returns the common part of the sliding log's two key names, with
// a hash tag that puts both in one Cluster slot whatever the key: the key
// itself when it has no braces, else a hash of it followed by "}=" and the
// key (a brace-free key's names go on with "}:", so the two forms never
// meet).
func logTag(prefix, key string) string {
	if !strings.ContainsAny(key, "{}") {
		return prefix + "{" + key + "}"
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return prefix + "{" + strconv.FormatUint(h.Sum64(), 16) + "}=" + key
}
