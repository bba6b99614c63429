package envoyrls

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// countingHook counts the round trips a client makes (a pipeline is one).
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

const redisCfg = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 4}
`

// Two services sharing one Redis admit one limit between them, a request
// of four descriptors is one round trip, and the keys are the
// reference's, so that a migration keeps its counts.
func TestRedisSharedAndOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	hook := &countingHook{}
	client := redisClient(t, &redis.Options{Addr: srv.Addr}, hook)
	clock := newFakeClock()
	one := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, time.Second), KeyPrefix: "p_"})
	two := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, time.Second), KeyPrefix: "p_"})
	one.clock, two.clock = clock, clock
	one.svc.o.Now, two.svc.o.Now = clock.Now, clock.Now
	client.FlushAll(t.Context())
	ok := 0
	for i := range 6 {
		r := one
		if i%2 == 1 {
			r = two
		}
		ok += r.admitted(1, "d", "a", "x")
	}
	if ok != 3 {
		t.Errorf("two services on one Redis: %d admitted, want 3", ok)
	}
	four := []*rlv3Desc{desc("a", "y"), desc("b", "y"), desc("c", "y"), desc("e", "y")}
	one.ask("d", four...) // loads the script
	before := hook.n.Load()
	resp := one.ask("d", four...)
	if n := hook.n.Load() - before; n != 1 {
		t.Errorf("4 descriptors took %d round trips, want 1", n)
	}
	if resp.Statuses[0].LimitRemaining != 1 || resp.Statuses[3].LimitRemaining != 3 {
		t.Errorf("statuses %v", resp.Statuses)
	}
	start := clock.Now().Unix() - clock.Now().Unix()%60
	if v, err := client.Get(t.Context(), "p_d_a_y_"+itoa(start)).Int(); err != nil || v != 2 {
		t.Errorf("the reference's key holds %d (%v), want 2", v, err)
	}
	if ttl := client.TTL(t.Context(), "p_d_a_y_"+itoa(start)).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("the key expires in %v, want within its minute", ttl)
	}
	one.wantAdmitted("token bucket on Redis", 4, 6, "d", "bucket", "z")
}

// A Redis Cluster: the keys of one request may be on different nodes.
func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { client.Close() })
	r := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, true, time.Second)})
	for i := range 5 {
		resp := r.ask("d", desc("a", "x"), desc("b", "x"), desc("c", "q"))
		want := codeOK
		if i >= 3 {
			want = codeOver
		}
		if resp.Statuses[0].Code != want || resp.Statuses[1].Code != codeOK || resp.Statuses[2].Code != codeOK {
			t.Fatalf("request %d: %v", i, resp.Statuses)
		}
	}
}

// A server that forgot the script (SCRIPT FLUSH, a restart, a failover)
// is sent it again, on one server and on a Cluster, and the counts go on.
func TestRedisScriptFlushed(t *testing.T) {
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for name, c := range map[string]redis.UniversalClient{
		"single":  redis.NewClient(&redis.Options{Addr: single.Addr}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Cleanup(func() { c.Close() })
			r := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, c, name == "cluster", time.Second)})
			for i := range 5 {
				if err := c.ScriptFlush(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
				resp := r.ask("d", desc("a", "x"), desc("b", "x"), desc("c", "q"))
				want := codeOK
				if i >= 3 {
					want = codeOver
				}
				if resp.Statuses[0].Code != want || resp.Statuses[1].LimitRemaining != uint32(4-i) {
					t.Fatalf("request %d after SCRIPT FLUSH: %v", i, resp.Statuses)
				}
			}
		})
	}
}

// Redis down: Unavailable (Envoy's failure_mode_deny decides), or OK with
// FailOpen; back up, decisions resume.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	client := redisClient(t, &redis.Options{Addr: srv.Addr, MaxRetries: -1})
	closed := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, 200*time.Millisecond)})
	open := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, 200*time.Millisecond), FailOpen: true})
	srv.Kill()
	if _, err := closed.client.ShouldRateLimit(t.Context(), req("d", desc("a", "x"))); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: %v", err)
	}
	if resp := open.ask("d", desc("a", "x")); resp.OverallCode != codeOK {
		t.Errorf("fail open: %v", resp)
	}
	srv.Restart(t)
	closed.wantAdmitted("after the restart", 3, 4, "d", "a", "w")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A paused Redis (SIGSTOP: connections accepted, nothing answered): every
// request still returns within the backend's timeout, UNAVAILABLE or, with
// FailOpen, OK, whether the client applies context deadlines (NewRedis)
// or not (a plain client: requests once waited for its 5 s dial timeout);
// after SIGCONT decisions resume.
func TestRedisPaused(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	info, err := redistest.Do(srv.Addr, time.Second, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "process_id:")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if err != nil {
		t.Fatalf("no process_id in INFO: %v", err)
	}
	client := redisClient(t, &redis.Options{Addr: srv.Addr, MaxRetries: -1})
	const timeout = 150 * time.Millisecond
	closed := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, timeout)})
	open := newRig(t, redisCfg, Options{Backend: newRedisBackend(t, client, false, timeout), FailOpen: true})
	own, err := NewRedis(RedisConfig{Addrs: []string{srv.Addr}, Timeout: timeout.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	direct := newRig(t, redisCfg, Options{Backend: own})
	closed.ask("d", desc("a", "x"))
	direct.ask("d", desc("a", "x"))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	for range 3 {
		for name, r := range map[string]*rig{"plain client": closed, "NewRedis": direct} {
			start := time.Now()
			_, err := r.client.ShouldRateLimit(t.Context(), req("d", desc("a", "x")))
			if status.Code(err) != codes.Unavailable || time.Since(start) > timeout+time.Second {
				t.Errorf("paused, fail closed, %s: %v after %v", name, err, time.Since(start))
			}
		}
		start := time.Now()
		if resp := open.ask("d", desc("a", "x")); resp.OverallCode != codeOK || time.Since(start) > timeout+time.Second {
			t.Errorf("paused, fail open: %v after %v", resp.OverallCode, time.Since(start))
		}
	}
	syscall.Kill(pid, syscall.SIGCONT)
	testproc.Eventually(t, 5*time.Second, func() bool {
		_, err := closed.svc.decide(t.Context(), req("d", desc("a", "probe")))
		return err == nil
	})
	closed.wantAdmitted("after SIGCONT", 3, 4, "d", "a", "after")
	testproc.Eventually(t, 5*time.Second, func() bool {
		_, err := direct.svc.decide(t.Context(), req("d", desc("a", "probe2")))
		return err == nil
	})
}

// Concurrent requests on one server share round trips (a batch is one
// script run), and the counts stay exact: 64 callers asking 20 times
// each about one key limited to 500 get exactly 500 admissions, and each
// admitted caller's remaining count is its own.
func TestRedisBatchesConcurrentRequests(t *testing.T) {
	srv := redistest.Start(t)
	hook := &countingHook{}
	client := redisClient(t, &redis.Options{Addr: srv.Addr, PoolSize: 64}, hook)
	r := newRig(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 500}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 100000}
`, Options{Backend: newRedisBackend(t, client, false, 5*time.Second)})
	client.FlushAll(t.Context())
	r.ask("d", desc("b", "warm")) // loads the script
	before := hook.n.Load()
	const callers, each = 64, 20
	var admitted atomic.Int64
	remaining := make([]atomic.Bool, 500)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				resp, err := r.client.ShouldRateLimit(context.Background(), req("d", desc("a", "hot"), desc("b", "x")))
				if err != nil {
					t.Error(err)
					return
				}
				if st := resp.Statuses[0]; st.Code == codeOK {
					admitted.Add(1)
					if remaining[st.LimitRemaining].Swap(true) {
						t.Errorf("remaining %d answered twice", st.LimitRemaining)
					}
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 500 {
		t.Errorf("%d admitted, want exactly 500", got)
	}
	trips := hook.n.Load() - before
	t.Logf("%d requests in %d round trips", callers*each, trips)
	if trips >= callers*each/2 {
		t.Errorf("%d requests took %d round trips: not batched", callers*each, trips)
	}
	day := r.clock.Now().Unix() - r.clock.Now().Unix()%86400
	if v, err := client.Get(t.Context(), "d_b_x_"+itoa(day)).Int(); v != callers*each {
		t.Errorf("the second descriptor's key holds %d (%v), want %d", v, err, callers*each)
	}
}

// newRedisBackend is NewRedisClient, closed when t ends.
// redisClient is a client of o with hooks, closed when t ends.
func redisClient(t testing.TB, o *redis.Options, hooks ...redis.Hook) *redis.Client {
	c := redis.NewClient(o)
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newRedisBackend(t testing.TB, client redis.UniversalClient, cluster bool, timeout time.Duration) *Redis {
	r := NewRedisClient(client, cluster, timeout)
	t.Cleanup(func() { r.Close() })
	return r
}
