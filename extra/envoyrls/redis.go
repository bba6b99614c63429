package envoyrls

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/redislimit"
)

// RedisConfig is the "redis" backend's connection.
type RedisConfig struct {
	// Addrs are host:port addresses: one server, or the seeds of a
	// Redis Cluster when Cluster is set.
	Addrs   []string `json:"addrs"`
	Cluster bool     `json:"cluster,omitempty"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `json:"password_env,omitempty"`
	// Timeout bounds each command (a Go duration; default "100ms").
	Timeout string `json:"timeout,omitempty"`
}

// fixedScript charges fixed-window keys in one round trip: INCRBY by its
// hits and, when that created the key (its count is the hits), EXPIRE
// after its unit; it returns the counts. ARGV holds hits and
// time-to-live in pairs. A key's window start is in its name, so the
// time-to-live set at its creation outlasts its window; the reference
// sets it again on every hit, a command more per key.
const fixedSource = `
local out = {}
for i = 1, #KEYS do
  local n = ARGV[2*i-1]
  local c = redis.call('INCRBY', KEYS[i], n)
  if c == tonumber(n) then
    redis.call('EXPIRE', KEYS[i], ARGV[2*i])
  end
  out[i] = c
end
return out
`

var (
	fixedScript     = redis.NewScript(fixedSource)
	fixedHash   any = fixedScript.Hash() // boxed once
)

// Redis is the Backend of a Redis server or Cluster shared by several
// service instances. Fixed windows use the reference's keys (prefix,
// domain, entries, window start), so that a migration keeps the counts,
// and all the fixed-window descriptors of the requests in flight together
// are charged by one script, one round trip (see batcher; on a Cluster,
// one script per key, pipelined: one round trip per node, as the keys of
// one request need not share a slot). The other algorithms are the
// limiters of package redislimit, one round trip per descriptor. A
// failing server fails the request with an error wrapping
// throttle.ErrUnavailable (see Options.FailOpen). Safe for concurrent
// use.
type Redis struct {
	client   redis.UniversalClient
	cluster  bool
	timeout  time.Duration
	limiters sync.Map // limiterSpec → throttle.Limiter
	batch    *batcher // joins the fixed windows of concurrent requests
}

// NewRedis connects to c (lazily: the first request dials).
func NewRedis(c RedisConfig) (*Redis, error) {
	timeout := 100 * time.Millisecond
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%w: envoy: redis.timeout %q", ErrInvalidConfig, c.Timeout)
		}
		timeout = d
	}
	o := &redis.UniversalOptions{Addrs: c.Addrs, IsClusterMode: c.Cluster, ContextTimeoutEnabled: true,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout}
	if c.PasswordEnv != "" {
		o.Password = getenv(c.PasswordEnv)
	}
	r := NewRedisClient(redis.NewUniversalClient(o), c.Cluster, timeout)
	r.batch.direct = true // ContextTimeoutEnabled
	return r, nil
}

// NewRedisClient uses client (a *redis.ClusterClient when cluster),
// each request bounded by timeout: a request waits for the client's
// answer at most that long (the call goes on in its own goroutine, to the
// client's own timeouts, as go-redis applies a context's deadline only
// with ContextTimeoutEnabled). Close closes client.
func NewRedisClient(client redis.UniversalClient, cluster bool, timeout time.Duration) *Redis {
	r := &Redis{client: client, cluster: cluster, timeout: timeout}
	r.batch = newBatcher(timeout, false, r.run)
	return r
}

// charge implements Backend.
func (r *Redis) charge(ctx context.Context, now time.Time, hits []hit, out []outcome) error {
	if !r.batch.direct { // the batcher's deadline does not bound the client
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	keys, args, at := newFixedArgs(len(hits))
	for i, h := range hits {
		if h.Limit.algorithm != fixedWindow {
			o, err := r.allowHit(ctx, h)
			if err != nil {
				return err
			}
			out[i] = o
			continue
		}
		keys = append(keys, windowKey(h.Key, windowStart(now, h.Limit.rlUnit)))
		args = append(args, h.N, ttlArgs[h.Limit.rlUnit])
		at = append(at, i)
	}
	if len(keys) == 0 {
		return nil
	}
	counts, err := r.batch.do(ctx, keys, args)
	if err != nil {
		return fmt.Errorf("%w: redis: %v", throttle.ErrUnavailable, err)
	}
	for j, i := range at {
		out[i] = fixedOutcome(now, hits[i].Limit, hits[i].N, uint64(counts[j]))
	}
	return nil
}

// fixedArgs1 and fixedArgs4 hold the script's keys and arguments of a
// request of one or up to four descriptors, and where each came from, in
// one allocation.
type (
	fixedArgs1 struct {
		keys [1]string
		args [2]any
		at   [1]int
	}
	fixedArgs4 struct {
		keys [4]string
		args [8]any
		at   [4]int
	}
)

// newFixedArgs returns empty slices for n keys, their arguments and
// their positions: one allocation when n is at most 4.
func newFixedArgs(n int) ([]string, []any, []int) {
	switch {
	case n == 1:
		f := new(fixedArgs1)
		return f.keys[:0], f.args[:0], f.at[:0]
	case n <= 4:
		f := new(fixedArgs4)
		return f.keys[:0], f.args[:0], f.at[:0]
	}
	return make([]string, 0, n), make([]any, 0, 2*n), make([]int, 0, n)
}

// run runs fixedScript on keys: once, or per key on a Cluster.
func (r *Redis) run(ctx context.Context, keys []string, args []any) ([]int64, error) {
	if !r.cluster {
		a := cmdArgsPool.Get().(*[]any)
		defer putCmdArgs(a)
		*a = scriptArgs(*a, keys, args)
		cmd := redis.NewIntSliceCmd(ctx, *a...)
		if err := r.client.Process(ctx, cmd); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return cmd.Result()
		}
		(*a)[0], (*a)[1] = "eval", fixedSource // the script once, then by its hash again
		cmd = redis.NewIntSliceCmd(ctx, *a...)
		_ = r.client.Process(ctx, cmd)
		return cmd.Result()
	}
	cmds := make([]*redis.IntSliceCmd, len(keys))
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = redis.NewIntSliceCmd(ctx, scriptArgs(nil, []string{k}, args[2*i:2*i+2])...)
			cmds[i].SetFirstKeyPos(3)
			_ = p.Process(ctx, cmds[i])
		}
		return nil
	})
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = fixedScript.Load(ctx, r.client).Err(); err == nil {
			return r.run(ctx, keys, args)
		}
	}
	if err != nil {
		return nil, err
	}
	counts := make([]int64, len(keys))
	for i, c := range cmds {
		v, err := c.Result()
		if err == nil && len(v) != 1 {
			err = fmt.Errorf("script returned %d counts for 1 key", len(v))
		}
		if err != nil {
			return nil, err
		}
		counts[i] = v[0]
	}
	return counts, nil
}

// scriptArgs appends to a the arguments of an EVALSHA of fixedScript on
// keys with args. The reply is read as an IntSliceCmd: the counts go
// straight into one []int64, not each boxed in a []any first.
func scriptArgs(a []any, keys []string, args []any) []any {
	a = append(a, "evalsha", fixedHash, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, args...)
}

// cmdArgsPool holds the argument slices of single-server script runs,
// which go-redis no longer reads once Process has returned.
var cmdArgsPool = sync.Pool{New: func() any { return new([]any) }}

func putCmdArgs(a *[]any) {
	if cap(*a) > 1024 {
		return // a rare huge batch: not kept
	}
	clear(*a)
	*a = (*a)[:0]
	cmdArgsPool.Put(a)
}

// windowKey is the counter key of a fixed window: the descriptor's key
// and the window's start (the reference's), built in one allocation.
func windowKey(key string, start int64) string {
	var buf [128]byte
	return string(strconv.AppendInt(append(buf[:0], key...), start, 10))
}

// ttlArgs are the time-to-live arguments of each unit, boxed once.
var ttlArgs = func() (a [unitWeek + 1]any) {
	for u := range a {
		a[u] = rlUnit(u).Seconds()
	}
	return a
}()

// allowHit decides a hit of another algorithm than the fixed window,
// within the timeout.
func (r *Redis) allowHit(ctx context.Context, h hit) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return allowHit(ctx, h, r.limiter)
}

func (r *Redis) limiter(l *limitRule) (throttle.Limiter, error) {
	s := specOf(l)
	if v, ok := r.limiters.Load(s); ok {
		return v.(throttle.Limiter), nil
	}
	limit, per := int(s.rpu), s.unit.Period()
	var lim throttle.Limiter
	var err error
	switch s.alg {
	case tokenBucket:
		lim, err = redislimit.NewTokenBucket(r.client, throttle.NewRate(limit, per), int(cmpOr(s.burst, s.rpu)), redislimit.WithPrefix("envoyrls:tb:"))
	case slidingWindow:
		lim, err = redislimit.NewSlidingWindow(r.client, limit, per, redislimit.WithPrefix("envoyrls:sw:"))
	case slidingLog:
		lim, err = redislimit.NewSlidingLog(r.client, limit, per, redislimit.WithPrefix("envoyrls:sl:"))
	default:
		err = fmt.Errorf("%w: %v", errUnsupported, s.alg)
	}
	if err != nil {
		return nil, err
	}
	v, _ := r.limiters.LoadOrStore(s, lim)
	return v.(throttle.Limiter), nil
}

func cmpOr(a, b uint32) uint32 {
	if a != 0 {
		return a
	}
	return b
}

// Close closes the client.
func (r *Redis) Close() error {
	r.batch.close()
	return r.client.Close()
}

var getenv = os.Getenv
