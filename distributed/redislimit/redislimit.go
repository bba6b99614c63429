package redislimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/deadline"
	"github.com/throttlekit/throttle/internal/optkit"
	"github.com/throttlekit/throttle/internal/report"
	"github.com/throttlekit/throttle/limiterkit"
)

// Defaults of the options.
const (
	// defaultPrefix starts every Redis key the limiters write.
	defaultPrefix = "throttle:"
	// defaultTimeout bounds one decision (one round trip).
	defaultTimeout = 100 * time.Millisecond
	// defaultBreakerFailures is how many consecutive failures open the
	// circuit breaker.
	defaultBreakerFailures = 3
	// defaultBreakerCooldown is how long an open breaker fails calls
	// without trying Redis before it lets one probe through.
	defaultBreakerCooldown = time.Second
	// virtualTTLFloor is the least key TTL, in milliseconds, with an
	// injected clock: TTLs run on the server's real time, which does not
	// follow virtual time.
	virtualTTLFloor = int64(time.Hour / time.Millisecond)
)

// Option configures a limiter of this package. Options of the throttle
// package (the clock, the key length bound) are passed with WithOptions.
type Option func(*config)

type config struct {
	prefix   string
	shared   bool // WithPrefix: the prefix is the namespace
	timeout  time.Duration
	policy   failsafe.Policy
	fallback throttle.Limiter
	failures int
	cooldown time.Duration
	obsName  string
	observer throttle.Observer
	throttle []throttle.Option
	lease    *leaseConfig
	optErr   error
	// WithReplicas
	replicas       int
	replicaTimeout time.Duration
	sawPolicy      bool
	sawFallbak     bool
}

// WithPrefix names the namespace of the limiter's keys, for limiters that
// share state on purpose: the Redis key of a limiter key is then prefix +
// algorithm + ":" + key, the same for every limiter of the algorithm with
// this prefix, whatever its configuration (a limit changed at runtime by
// a new deployment keeps what each key has used). Without WithPrefix the
// Redis key is "throttle:" + algorithm + "(" + configuration + "):" +
// key, so that two limiters of one algorithm and different limits never
// share state by accident; limiters of the same algorithm and the same
// limit do share it (they decide alike), unless given different
// prefixes.
func WithPrefix(p string) Option { return func(c *config) { c.prefix, c.shared = p, true } }

// WithTimeout bounds each decision (default 100 ms). When Redis
// does not answer before this timeout or the caller's own deadline,
// whichever is earlier, the failure policy applies, the breaker counts the
// failure, and an error wraps throttle.ErrUnavailable and the deadline's
// error. A caller that cancels its context gets ctx.Err(), counted as
// nothing. The client must honour context deadlines
// (go-redis Options.ContextTimeoutEnabled); when it does not, each call is
// raced against the timeout in a goroutine instead.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithPolicy sets the failure policy (default failsafe.Closed). failsafe.Fallback
// needs WithFallback.
func WithPolicy(p failsafe.Policy) Option {
	return func(c *config) { c.policy, c.sawPolicy = p, true }
}

// WithFallback sets the local limiter asked while Redis is unavailable
// and selects the failsafe.Fallback policy. A good fallback is the same
// algorithm with the limit divided by the number of instances.
func WithFallback(l throttle.Limiter) Option {
	return func(c *config) {
		c.fallback, c.sawFallbak = l, true
		if !c.sawPolicy {
			c.policy = failsafe.Fallback
		}
	}
}

// WithBreaker configures the circuit breaker: after failures consecutive
// failed calls it opens, and calls fail at once (in microseconds, without
// touching the network) for cooldown; then one call probes Redis and
// closes the breaker if it succeeds. failures 0 disables the breaker.
// Defaults: 3 failures, a cooldown of 1 s.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(c *config) { c.failures, c.cooldown = failures, cooldown }
}

// WithReplicas makes every decision durable on n replicas before it is
// answered: after each script (or pipeline of scripts) the limiter sends
// WAIT n timeout on the same connection, and a decision that fewer than n
// replicas acknowledged within timeout is a failure (the failure policy
// answers it, the breaker counts it), although the master applied it. A
// failover to an acknowledging replica then loses no admission (see
// "Failover" in the package documentation). timeout should stay well
// below WithTimeout, which bounds the whole call. It needs a client that
// sends a pipeline on one connection to the key's master: *redis.Client,
// including a Sentinel failover client; with a Cluster or Ring client the
// constructor fails. WAIT costs about one replication round trip per
// decision (see the package documentation for a measurement).
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) { c.replicas, c.replicaTimeout = n, timeout }
}

// WithObserver reports to o, under name, every call as throttle.Observe
// does (an EventDecision, or an EventError for a call that failed, timed
// for a throttle.LatencyObserver), and the limiter's own events: the
// circuit breaker opening and closing (EventBreakerOpen,
// EventBreakerClosed), each call the failure policy decided while Redis
// was unavailable (EventFallback, with the decision and the error: a
// failsafe.Closed refusal is a denied fallback, reported beside the call's
// EventError), and a server whose eviction policy can drop limiter state
// (EventWarning). o is called from the calling goroutine and must not
// block. Nil turns it off.
func WithObserver(name string, o throttle.Observer) Option {
	return func(c *config) { c.obsName, c.observer = name, o }
}

// WithOptions passes options of the throttle package: WithClock (tests
// pass virtual time explicitly to the scripts instead of reading the
// server's TIME) and WithMaxKeyLen. Other settings do not apply to state
// kept in Redis.
func WithOptions(opts ...throttle.Option) Option {
	return func(c *config) { c.throttle = append(c.throttle, opts...) }
}

// core is what every limiter of this package shares: the client, the key
// layout, the clock, the failure policy and the breaker.
type core struct {
	client    redis.UniversalClient
	prefix    string // prefix + algorithm + ":"
	limit     int
	settings  limiterkit.Settings
	clk       clock.Source
	virtual   bool
	ttlFloor  string
	timeout   time.Duration
	direct    bool // the client honours context deadlines
	policy    failsafe.Policy
	fallback  throttle.Limiter
	report    report.To
	evictSeen atomic.Bool // the eviction policy was checked
	br        failsafe.Breaker
	deadlines deadline.Shared
	batch     batcher
	closed    atomic.Bool
	closers   []func()
	replicas  int           // WithReplicas: WAIT for this many replicas
	waitFor   time.Duration // WAIT's timeout
}

// newCore returns the core of a limiter of algorithm alg (the key
// prefix's part: "tb", "fw", ...) and its configuration, from opts; conf
// states the limit (the parameters its decisions depend on), the
// namespace of its keys unless WithPrefix names one.
func newCore(client redis.UniversalClient, alg, conf string, limit int, opts []Option) (*core, *config, error) {
	if client == nil {
		return nil, nil, fmt.Errorf("%w: nil redis client", throttle.ErrInvalid)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, nil, err
	}
	s, err := limiterkit.NewSettings(cfg.throttle...)
	if err != nil {
		return nil, nil, err
	}
	if err := cfg.check(client, alg); err != nil {
		return nil, nil, err
	}
	c := &core{
		client:   client,
		prefix:   namespace(cfg, alg, conf),
		limit:    limit,
		settings: s,
		clk:      clock.New(s.Clock),
		virtual:  s.Clock != nil,
		ttlFloor: "1",
		timeout:  cfg.timeout,
		direct:   honoursDeadlines(client),
		policy:   cfg.policy,
		fallback: cfg.fallback,
		report:   report.New(cfg.obsName, cfg.observer),
		replicas: cfg.replicas,
		waitFor:  cfg.replicaTimeout,
	}
	if c.virtual {
		c.ttlFloor = fmt.Sprint(virtualTTLFloor)
	}
	if err := c.br.Init(cfg.failures, cfg.cooldown, cfg.cooldown); err != nil {
		return nil, nil, err
	}
	c.deadlines.Init(cfg.timeout)
	return c, cfg, nil
}

// namespace is the prefix of a limiter's Redis keys: WithPrefix's prefix
// and the algorithm, or the default prefix, the algorithm and its
// configuration.
func namespace(cfg *config, alg, conf string) string {
	if cfg.shared {
		return cfg.prefix + alg + ":"
	}
	return cfg.prefix + alg + "(" + conf + "):"
}

// newConfig applies opts to the defaults.
func newConfig(opts []Option) (*config, error) {
	cfg := &config{
		prefix:   defaultPrefix,
		timeout:  defaultTimeout,
		failures: defaultBreakerFailures,
		cooldown: defaultBreakerCooldown,
	}
	if err := optkit.Apply(cfg, "redislimit", opts); err != nil {
		return nil, err
	}
	return cfg, nil
}

// check reports the first option of cfg that does not fit a limiter of
// algorithm alg over client, with an error wrapping throttle.ErrInvalid.
func (cfg *config) check(client redis.UniversalClient, alg string) error {
	switch {
	case cfg.optErr != nil:
		return cfg.optErr
	case cfg.timeout <= 0:
		return fmt.Errorf("%w: WithTimeout(%v): must be positive", throttle.ErrInvalid, cfg.timeout)
	case cfg.policy < failsafe.Closed || cfg.policy > failsafe.Fallback:
		return fmt.Errorf("%w: unknown policy %v", throttle.ErrInvalid, cfg.policy)
	case cfg.policy == failsafe.Fallback && cfg.fallback == nil:
		return fmt.Errorf("%w: failsafe.Fallback needs a limiter (WithFallback)", throttle.ErrInvalid)
	case cfg.sawFallbak && cfg.fallback == nil:
		return fmt.Errorf("%w: WithFallback(nil)", throttle.ErrInvalid)
	case cfg.failures < 0 || (cfg.failures > 0 && cfg.cooldown <= 0):
		return fmt.Errorf("%w: WithBreaker(%d, %v)", throttle.ErrInvalid, cfg.failures, cfg.cooldown)
	case cfg.replicas < 0 || cfg.replicas > 0 && (cfg.replicaTimeout < time.Millisecond || cfg.replicaTimeout >= cfg.timeout):
		return fmt.Errorf("%w: WithReplicas(%d, %v): want n >= 0 and a timeout of 1ms or more, below WithTimeout (%v)",
			throttle.ErrInvalid, cfg.replicas, cfg.replicaTimeout, cfg.timeout)
	case cfg.replicas > 0 && !onOneConnection(client):
		return fmt.Errorf("%w: WithReplicas needs a *redis.Client (standalone or Sentinel), not %T: WAIT must follow the write on its connection", throttle.ErrInvalid, client)
	case cfg.lease != nil && alg != "tb":
		return fmt.Errorf("%w: WithLeasing applies to token buckets only", throttle.ErrInvalid)
	case strings.ContainsAny(alg, "{}"):
		return fmt.Errorf("%w: algorithm name %q", throttle.ErrInvalid, alg)
	}
	return nil
}

// onOneConnection reports whether client sends a pipeline on one
// connection, so that WAIT follows the scripts it is about.
func onOneConnection(client redis.UniversalClient) bool {
	_, ok := client.(*redis.Client)
	return ok
}

// errNotReplicated fails a decision that fewer replicas acknowledged than
// WithReplicas asks.
var errNotReplicated = errors.New("WAIT: fewer replicas acknowledged the decision than WithReplicas asks")

// exec runs s, and with WithReplicas waits for the replicas.
func (c *core) exec(ctx context.Context, s *luaScript, keys []string, args []any) (any, error) {
	if c.replicas == 0 {
		return s.run(ctx, c.client, keys, args)
	}
	p := &pending{s: s, keys: keys, args: args}
	c.pipeline(ctx, []*pending{p})
	return p.v, p.err
}

// honoursDeadlines reports whether client applies context deadlines to
// its socket reads and writes.
func honoursDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// check validates a request before any network traffic.
func (c *core) check(key string, n int) error {
	if c.closed.Load() {
		return throttle.ErrClosed
	}
	if err := c.settings.CheckKey(key); err != nil {
		return err
	}
	return limiterkit.CheckN(n, c.limit)
}

// allowWith is Allow: it checks key and n, has allow decide them, and
// reports the call.
func (c *core) allowWith(ctx context.Context, key string, n int, allow func(context.Context, string, int) (throttle.Decision, error)) (throttle.Decision, error) {
	start := c.report.Start()
	var d throttle.Decision
	err := c.check(key, n)
	if err == nil {
		d, err = allow(ctx, key, n)
	}
	c.report.Call(throttle.MethodAllow, key, n, d, err, start)
	return d, err
}

// now returns the reference instant of a call and the mode argument: an
// injected clock is passed to the script as the time of the decision;
// otherwise the script reads the server's TIME and the local clock only
// keeps the offsets small.
func (c *core) now() (ref int64, mode string) {
	if c.virtual {
		return c.clk.Now(), "0"
	}
	return c.clk.Now(), "1"
}

// common returns the arguments every script starts with.
func (c *core) common(args []any, ref int64, mode string) []any {
	return append(args, mode, ref/1e9, ref%1e9, c.ttlFloor)
}

// run evaluates script on keys with args under the per-call deadline and
// the breaker. It returns the reply, an array, or an error wrapping
// throttle.ErrUnavailable.
func (c *core) run(ctx context.Context, s *luaScript, keys []string, args []any) ([]any, error) {
	v, err := c.eval(ctx, s, keys, args)
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok {
		return nil, c.failed(ctx, fmt.Errorf("unexpected reply %T", v))
	}
	return a, nil
}

// eval is run for a reply of any type.
func (c *core) eval(ctx context.Context, s *luaScript, keys []string, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	probe, ok := c.br.Allow(deadline.Mono())
	if !ok {
		return nil, failsafe.ErrOpen
	}
	cctx, cancel := c.deadlines.With(ctx)
	if cancel != nil {
		defer cancel()
	}
	var (
		v   any
		err error
	)
	if c.direct {
		v, err = c.do(cctx, s, keys, args)
	} else {
		type result struct {
			v   any
			err error
		}
		ch := make(chan result, 1)
		go func() {
			v, err := c.exec(cctx, s, keys, args)
			ch <- result{v, err}
		}()
		select {
		case r := <-ch:
			v, err = r.v, r.err
		case <-cctx.Done():
			err = cctx.Err()
		}
	}
	if err == nil {
		c.succeeded(ctx, probe)
		return v, nil
	}
	if isDataError(err) {
		// Redis answered: one key holds data the script cannot read. That
		// key alone fails; no outage is counted and no policy admits it.
		c.succeeded(ctx, probe)
		return nil, fmt.Errorf("%w: redislimit: key %q holds data of another kind or format (delete it to reset the key): %w", throttle.ErrInvalid, keys[0], err)
	}
	return nil, c.failedCall(ctx, err, probe)
}

// badValueCode is the error code the scripts raise when a key holds a
// value no limiter wrote (see bad in lua/prelude.lua).
const badValueCode = "THROTTLE_BADVALUE"

// isDataError reports whether err is Redis's answer that the key holds
// data the script cannot use: a value of another type (WRONGTYPE), or
// one the script's own validation rejected. Every other error reply
// (OOM, READONLY, MASTERDOWN, LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, ...)
// is the server's state, whatever key it names: a failure to answer.
func isDataError(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	switch errorCode(rerr.Error()) {
	case "WRONGTYPE", badValueCode:
		return true
	}
	return false
}

// errorCode returns the code of a Redis error reply: its first word, or,
// for an error raised inside a script by Redis before 7 ("ERR Error
// running script ...: -CODE message"), the code of the inner error.
func errorCode(msg string) string {
	code, _, _ := strings.Cut(msg, " ")
	if code == "ERR" && strings.Contains(msg, "Error running script") {
		if _, inner, ok := strings.Cut(msg, ": -"); ok {
			code, _, _ = strings.Cut(inner, " ")
		}
	}
	return code
}

// failed records a failed call and returns its error.
func (c *core) failed(ctx context.Context, err error) error { return c.failedCall(ctx, err, false) }

// failedCall records a failed call, the breaker's probe if probe, and
// returns its error.
func (c *core) failedCall(ctx context.Context, err error, probe bool) error {
	if errors.Is(ctx.Err(), context.Canceled) { // the caller gave up: not Redis's fault
		c.br.Release(probe)
		return ctx.Err()
	}
	// Redis did not answer before the earlier of the caller's deadline and
	// WithTimeout: an outage either way, counted by the breaker and
	// answered by the failure policy.
	opened := c.br.Failure(deadline.Mono(), probe)
	if cerr := ctx.Err(); cerr != nil {
		err = cerr
	}
	err = fmt.Errorf("%w: redis: %w", throttle.ErrUnavailable, err)
	if opened {
		c.observe(throttle.Event{Kind: throttle.EventBreakerOpen, Err: err})
	}
	return err
}

// succeeded records a call Redis answered; the first one also checks the
// server's eviction policy.
func (c *core) succeeded(ctx context.Context, probe bool) {
	if c.br.Success(probe) {
		c.observe(throttle.Event{Kind: throttle.EventBreakerClosed})
	}
	if !c.evictSeen.Load() && c.evictSeen.CompareAndSwap(false, true) {
		c.checkEviction(ctx)
	}
}

// observe reports e, an event of the limiter's own, to the observer, if
// any.
func (c *core) observe(e throttle.Event) { c.report.Event(e) }

// checkEviction warns (EventWarning, and the error func) when the
// server may evict limiter state: a memory limit with any policy but
// noeviction. Every limiter key carries a TTL, so volatile-* policies
// evict them too. A server that refuses CONFIG (renamed or disabled, a
// managed service) is not checked.
func (c *core) checkEviction(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	conf, err := c.client.ConfigGet(cctx, "maxmemory*").Result()
	if err != nil {
		return
	}
	if policy := conf["maxmemory-policy"]; conf["maxmemory"] != "0" && policy != "" && policy != "noeviction" {
		err := fmt.Errorf("redislimit: the server has maxmemory %s with maxmemory-policy %s: under memory pressure it evicts limiter keys, and an evicted key starts fresh (over-admission); use noeviction, or memory enough never to evict", conf["maxmemory"], policy)
		c.observe(throttle.Event{Kind: throttle.EventWarning, Err: err})
	}
}

// fail applies the failure policy to a request that Redis could not
// decide.
func (c *core) fail(ctx context.Context, key string, n int, err error) (throttle.Decision, error) {
	if !errors.Is(err, throttle.ErrUnavailable) {
		return throttle.Decision{Limit: c.limit}, err
	}
	var d throttle.Decision
	switch c.policy {
	case failsafe.Open:
		d = throttle.Decision{Allowed: true, Limit: c.limit, Remaining: c.limit - n}
	case failsafe.Fallback:
		var ferr error
		if d, ferr = c.fallback.Allow(ctx, key, n); ferr != nil {
			return d, ferr
		}
	default: // failsafe.Closed: refused, with the error
		d = throttle.Decision{Limit: c.limit, RetryAfter: c.br.RetryAfter(deadline.Mono())}
	}
	c.observe(throttle.Event{Kind: throttle.EventFallback, Key: key, N: n, Decision: d, Err: err})
	if c.policy == failsafe.Closed {
		return d, err
	}
	return d, nil
}

// Close makes further calls fail with throttle.ErrClosed and ends the
// limiter's background work, if it has any (a Bucket's token leasing, a
// Concurrency's retried releases), waiting for it. It does not close the
// Redis client, which belongs to the caller. Close is idempotent and
// returns nil.
func (c *core) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	for _, f := range c.closers {
		f()
	}
	return nil
}

func integer(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		var n int64
		fmt.Sscan(x, &n)
		return n
	}
	return 0
}
