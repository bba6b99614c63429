package redislimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/internal/report/reporttest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Fault tests run on real time against a redis-server of their own; each
// is bounded by a few seconds.

const (
	faultTimeout = 50 * time.Millisecond
	// latencySlack is what a call may take beyond the timeout: scheduling
	// on a loaded 2-core machine under -race.
	latencySlack = 150 * time.Millisecond
	cooldown     = 100 * time.Millisecond
)

// call runs Allow and fails the test if it took longer than the timeout
// plus slack.
func call(t *testing.T, l throttle.Limiter, key string) (throttle.Decision, time.Duration, error) {
	t.Helper()
	start := time.Now()
	d, err := l.Allow(context.Background(), key, 1)
	el := time.Since(start)
	if el > faultTimeout+latencySlack {
		t.Fatalf("Allow took %v, beyond the %v timeout (+%v slack)", el, faultTimeout, latencySlack)
	}
	return d, el, err
}

// waitHealthy calls until a call succeeds (after the breaker's cooldown),
// within a bounded time.
func waitHealthy(t *testing.T, l throttle.Limiter, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := call(t, l, key); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("limiter did not recover within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// faultBucket returns a token bucket on c at 1000/s, burst 1000, under a
// prefix of its own, with the fault timeout and opts, that has answered
// one call; it is closed at the end of the test.
func faultBucket(t *testing.T, c redis.UniversalClient, opts ...Option) *Bucket {
	t.Helper()
	l, err := NewTokenBucket(c, throttle.PerSecond(1000), 1000,
		append([]Option{WithPrefix(uniquePrefix()), WithTimeout(faultTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if _, _, err := call(t, l, "k"); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFaultKillRestart(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	for _, policy := range []failsafe.Policy{failsafe.Closed, failsafe.Open} {
		t.Run(policy.String(), func(t *testing.T) {
			l := faultBucket(t, c, WithBreaker(3, cooldown), WithPolicy(policy))
			srv.Kill()
			var fast int
			for i := range 50 {
				d, el, err := call(t, l, "k")
				switch policy {
				case failsafe.Closed:
					if !errors.Is(err, throttle.ErrUnavailable) || d.Allowed {
						t.Fatalf("call %d with Redis down: %+v, %v; want denied, ErrUnavailable", i, d, err)
					}
				case failsafe.Open:
					if err != nil || !d.Allowed {
						t.Fatalf("call %d with Redis down: %+v, %v; want allowed", i, d, err)
					}
				}
				if el < time.Millisecond {
					fast++
				}
			}
			if fast < 40 {
				t.Errorf("only %d of 50 calls took under 1ms with Redis down: the breaker should open", fast)
			}
			srv.Restart(t)
			waitHealthy(t, l, "k")
		})
	}
}

func TestFaultScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	l, err := NewTokenBucket(c, throttle.PerHour(1), 3, WithPrefix(uniquePrefix()), WithTimeout(faultTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		if _, err := c.ScriptFlush(ctx).Result(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, "k", 1)
		if err != nil || !d.Allowed || d.Remaining != 2-i {
			t.Fatalf("call %d after SCRIPT FLUSH: %+v, %v", i, d, err)
		}
	}
	if d, err := l.Allow(ctx, "k", 1); err != nil || d.Allowed {
		t.Fatalf("fourth call: %+v, %v; want denied (state kept across flushes)", d, err)
	}
}

func TestFaultClientPause(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	local, err := tokenbucket.New(throttle.PerSecond(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	l := faultBucket(t, c, WithBreaker(3, cooldown), WithFallback(local))
	if _, err := redistest.Do(srv.Addr, time.Second, "CLIENT", "PAUSE", "600", "ALL"); err != nil {
		t.Fatal(err)
	}
	// The fallback admits one unit, then denies: its decisions, no errors.
	var allowed int
	for i := range 20 {
		d, _, err := call(t, l, "k")
		if err != nil {
			t.Fatalf("call %d during CLIENT PAUSE: %v; want the fallback's decision", i, err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 1 {
		t.Fatalf("fallback admitted %d during the pause, want 1", allowed)
	}
	waitHealthy(t, l, "k")
}

// refusingClient returns a client of an address where nothing listens.
func refusingClient(t *testing.T) *redis.Client {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFaultConnectionRefused(t *testing.T) {
	c := refusingClient(t)
	var obs reporttest.Recorder
	l, err := NewFixedWindow(c, 10, time.Second, WithTimeout(faultTimeout), WithBreaker(2, time.Hour),
		WithObserver("w", &obs))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		d, _, err := call(t, l, "k")
		if !errors.Is(err, throttle.ErrUnavailable) || d.Allowed {
			t.Fatalf("call %d: %+v, %v; want denied with ErrUnavailable", i, d, err)
		}
		if i >= 2 && d.RetryAfter <= 0 {
			t.Fatalf("call %d with the breaker open: RetryAfter %v, want the cooldown left", i, d.RetryAfter)
		}
	}
	if n := obs.Count(throttle.EventBreakerOpen, "w"); n != 1 {
		t.Errorf("the breaker opened %d times, want once (after 2 failures)", n)
	}
}

// TestFaultNoDeadlineClient checks the guarded path for a client that
// ignores context deadlines: calls are still bounded by the timeout.
func TestFaultNoDeadlineClient(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 700 * time.Millisecond})
	defer c.Close()
	l := faultBucket(t, c, WithBreaker(0, 0))
	if _, err := redistest.Do(srv.Addr, time.Second, "CLIENT", "PAUSE", "300", "ALL"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := call(t, l, "k"); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("during pause: %v, want ErrUnavailable", err)
	}
	waitHealthy(t, l, "k")
	time.Sleep(800 * time.Millisecond) // let the abandoned call end before goleak looks
}

// TestFaultScriptFlushBatched flushes the scripts while many goroutines
// decide at once, so that pipelined calls meet NOSCRIPT too.
func TestFaultScriptFlushBatched(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	clk := throttletest.NewClock()
	const limit = 500
	l, err := NewTokenBucket(c, throttle.PerHour(1), limit, vclock(clk), WithPrefix(uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := range 25 {
				if w == 0 && i%5 == 0 {
					if err := c.ScriptFlush(ctx).Err(); err != nil {
						t.Error(err)
					}
				}
				d, err := l.Allow(ctx, "k", 1)
				if err != nil {
					t.Errorf("worker %d call %d: %v", w, i, err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d of 800 calls with time frozen, want exactly %d", got, limit)
	}
}

// A caller's deadline shorter than WithTimeout: when Redis does not answer
// before it, the failure policy applies, the breaker counts the failure,
// and the error wraps both ErrUnavailable and the deadline.
func TestFaultCallerDeadline(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	closed, err := NewTokenBucket(c, throttle.PerSecond(1000), 1000, WithPrefix(uniquePrefix()),
		WithTimeout(5*time.Second), WithBreaker(3, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	open, err := NewTokenBucket(c, throttle.PerSecond(1000), 1000, WithPrefix(uniquePrefix()),
		WithTimeout(5*time.Second), WithPolicy(failsafe.Open))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Do(srv.Addr, time.Second, "CLIENT", "PAUSE", "1500", "ALL"); err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 25*time.Millisecond)
	}
	ctx, cancel := short()
	_, err = closed.Allow(ctx, "k", 1)
	cancel()
	if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("failsafe.Closed past the caller's deadline: %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	ctx, cancel = short()
	d, err := open.Allow(ctx, "k", 1)
	cancel()
	if err != nil || !d.Allowed {
		t.Fatalf("failsafe.Open past the caller's deadline: %+v, %v; want admitted", d, err)
	}
	// Two more short calls open the breaker: the next call fails at once.
	for range 2 {
		ctx, cancel := short()
		_, _ = closed.Allow(ctx, "k", 1)
		cancel()
	}
	start := time.Now()
	_, err = closed.Allow(context.Background(), "k", 1)
	if !errors.Is(err, throttle.ErrUnavailable) || time.Since(start) > 20*time.Millisecond {
		t.Fatalf("after 3 failures: %v after %v; want the open breaker's fast ErrUnavailable", err, time.Since(start))
	}
}

// The sliding log's summary key lost (evicted, deleted) while its entries
// remain: the count is rebuilt from the entries, so the limit holds and
// the state stays readable.
func TestSlidingLogSummaryLost(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv)
	prefix := uniquePrefix()
	l, err := NewSlidingLog(c, 5, time.Minute, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admitted := 0
	for round := range 3 {
		for range 5 {
			d, err := l.Allow(ctx, "k", 1)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if n, err := c.Del(ctx, prefix+"sl:{k}:meta").Result(); err != nil || n != 1 {
			t.Fatalf("DEL of the summary: %d, %v", n, err)
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d in a minute with the summary deleted twice, want 5", admitted)
	}
}

// One key holding data of another type or format fails alone: the breaker
// does not open for the other keys, and failsafe.Open does not admit it.
func TestBadDataIsThatKeysError(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()
	for _, policy := range []failsafe.Policy{failsafe.Closed, failsafe.Open} {
		prefix := uniquePrefix()
		l, err := NewTokenBucket(c, throttle.PerMinute(3), 3, WithPrefix(prefix), WithPolicy(policy), WithBreaker(3, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		sl, err := NewSlidingLog(c, 3, time.Minute, WithPrefix(prefix), WithPolicy(policy), WithBreaker(3, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, prefix+"tb:victim", "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, prefix+"sl:{victim}:meta", "-3 x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		// A string the scripts' own validation rejects, in the bucket and
		// in the sliding log's entries.
		if err := c.Set(ctx, prefix+"tb:garbage", "12x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.RPush(ctx, prefix+"sl:{garbage}:log", "x 1").Err(); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []struct {
			lim throttle.Limiter
			key string
		}{{l, "victim"}, {sl, "victim"}, {l, "garbage"}, {sl, "garbage"}} {
			lim := bad.lim
			for i := range 10 {
				d, err := lim.Allow(ctx, bad.key, 1)
				if !errors.Is(err, throttle.ErrInvalid) || errors.Is(err, throttle.ErrUnavailable) || d.Allowed {
					t.Fatalf("%v, call %d on the bad key %s: %+v, %v; want that key's error, not admitted", policy, i, bad.key, d, err)
				}
			}
			if d, err := lim.Allow(ctx, "other", 1); err != nil || !d.Allowed {
				t.Fatalf("%v: another key after the bad one: %+v, %v", policy, d, err)
			}
		}
	}
}

// TestFaultConcurrencyNoLeak: calls that time out during a CLIENT PAUSE
// (some while queued behind others) must not leave units held by nobody:
// once the pause is over and the late releases have run, Redis holds
// exactly the units the process records. (57 to 60 of 64 slots leaked
// before.) One call may not take more than maxUnitsPerCall units.
func TestFaultConcurrencyNoLeak(t *testing.T) {
	srv := redistest.Start(t)
	srv.NeedOwn(t)
	c := newClient(t, srv)
	prefix := uniquePrefix()
	l, err := NewConcurrency(c, 64, time.Hour, WithPrefix(prefix), WithTimeout(faultTimeout), WithBreaker(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if big, err := NewConcurrency(c, 4*maxUnitsPerCall, time.Hour, WithPrefix(prefix)); err != nil {
		t.Fatal(err)
	} else if _, err := big.Allow(t.Context(), "big", maxUnitsPerCall+1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Allow(maxUnitsPerCall+1) = %v, want an error wrapping ErrInvalid", err)
	}
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Now().Before(stop) {
			redistest.Do(srv.Addr, time.Second, "CLIENT", "PAUSE", "120", "WRITE")
			time.Sleep(150 * time.Millisecond)
		}
	})
	var held atomic.Int64
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				// Units released (or retried) are not held; a failed
				// Release is retried in the background.
				if d, err := l.Allow(t.Context(), "k", 1); err == nil && d.Allowed {
					l.Release(t.Context(), "k", 1)
				}
			}
		})
	}
	wg.Wait()
	l.Close() // retries the releases that failed, and waits for them
	n, err := redistest.Do(srv.Addr, time.Second, "ZCARD", prefix+"cc:k")
	if err != nil {
		t.Fatal(err)
	}
	var inRedis int64
	fmt.Sscan(n, &inRedis)
	if inRedis != held.Load() {
		t.Errorf("Redis holds %d units, the process %d: %d held by nobody", inRedis, held.Load(), inRedis-held.Load())
	}
}

// startReplicated starts a master and a replica of it, in sync.
func startReplicated(t *testing.T) (master, replica *redistest.Server) {
	t.Helper()
	master = redistest.Start(t, "--repl-diskless-sync-delay", "0")
	master.NeedOwn(t)
	replica = redistest.Start(t)
	if _, err := redistest.Do(replica.Addr, time.Second, "REPLICAOF", "127.0.0.1", fmt.Sprint(master.Port())); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := redistest.Do(replica.Addr, time.Second, "INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "master_link_status:up") {
			return master, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync: %s", info)
		}
	}
}

// countingLimiter counts the calls that reach it.
type countingLimiter struct {
	throttle.Limiter
	calls atomic.Int64
}

func (c *countingLimiter) Allow(ctx context.Context, key string, n int) (throttle.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.Allow(ctx, key, n)
}

// A server that answers every script with an error about its own state
// (out of memory under noeviction, a read-only replica) is an outage, not
// bad data in the key: failsafe.Open admits, the fallback is asked, the
// breaker opens, and the error wraps ErrUnavailable, not ErrInvalid.
// (Every call failed with ErrInvalid before: Redis's OOM and READONLY
// errors inside a script name @user_script.)
func TestServerStateIsAnOutage(t *testing.T) {
	master, replica := startReplicated(t)
	for _, tc := range []struct {
		name  string
		srv   *redistest.Server
		setup func()
	}{
		{"OOM", master, func() {
			for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
				if _, err := redistest.Do(master.Addr, time.Second, "CONFIG", "SET", kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"READONLY", replica, func() {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			c := newClient(t, tc.srv)
			ctx := context.Background()
			local, err := tokenbucket.New(throttle.PerHour(1), 1000)
			if err != nil {
				t.Fatal(err)
			}
			fb := &countingLimiter{Limiter: local}
			prefix := uniquePrefix()
			build := func(opts ...Option) []throttle.Limiter {
				opts = append(opts, WithPrefix(prefix), WithBreaker(0, 0))
				tb, err1 := NewTokenBucket(c, throttle.PerHour(1), 1, opts...)
				sl, err2 := NewSlidingLog(c, 1, time.Hour, opts...)
				fw, err3 := NewFixedWindow(c, 1, time.Hour, opts...)
				cc, err4 := NewConcurrency(c, 1, time.Hour, opts...)
				if err := errors.Join(err1, err2, err3, err4); err != nil {
					t.Fatal(err)
				}
				if tc.name == "OOM" {
					// The concurrency script's first write (ZREMRANGEBYSCORE)
					// lets Redis run the rest of it whatever the memory.
					return []throttle.Limiter{tb, sl, fw}
				}
				return []throttle.Limiter{tb, sl, fw, cc}
			}
			for i, l := range build(WithPolicy(failsafe.Closed)) {
				if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrUnavailable) || errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("failsafe.Closed limiter %d: %v; want ErrUnavailable, not ErrInvalid", i, err)
				}
			}
			for i, l := range build(WithPolicy(failsafe.Open)) {
				for range 3 {
					if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed {
						t.Fatalf("failsafe.Open limiter %d: %+v, %v; want admitted", i, d, err)
					}
				}
			}
			for i, l := range build(WithFallback(fb)) {
				before := fb.calls.Load()
				if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed || fb.calls.Load() != before+1 {
					t.Fatalf("fallback limiter %d: %+v, %v, fallback asked %d times; want admitted by the fallback", i, d, err, fb.calls.Load()-before)
				}
			}
			// Three such errors open the breaker: it stays open for its
			// cooldown even though a healthy server answers meanwhile.
			l, err := NewTokenBucket(newClient(t, master), throttle.PerHour(1), 1, WithPrefix(prefix), WithBreaker(3, time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "READONLY" {
				l, err = NewTokenBucket(c, throttle.PerHour(1), 1, WithPrefix(prefix), WithBreaker(3, time.Hour))
				if err != nil {
					t.Fatal(err)
				}
			}
			for range 3 {
				_, _ = l.Allow(ctx, "k", 1)
			}
			if tc.name == "OOM" {
				if _, err := redistest.Do(master.Addr, time.Second, "CONFIG", "SET", "maxmemory", "0"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrUnavailable) {
				t.Fatalf("after 3 server errors: %v; want the open breaker's ErrUnavailable", err)
			}
		})
	}
}

// WithReplicas: every decision answered was acknowledged by a replica, so
// a failover to it loses no admission; without enough replicas no
// decision is answered (the failure policy answers).
func TestReplicasSurviveFailover(t *testing.T) {
	master, replica := startReplicated(t)
	prefix := uniquePrefix()
	mc := newClient(t, master)
	if _, err := NewTokenBucket(mc, throttle.PerHour(10), 10, WithReplicas(1, time.Second)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("WithReplicas timeout not below WithTimeout: %v, want ErrInvalid", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr}})
	defer cc.Close()
	if _, err := NewTokenBucket(cc, throttle.PerHour(10), 10, WithReplicas(1, 10*time.Millisecond)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("WithReplicas on a cluster client: %v, want ErrInvalid", err)
	}
	opts := []Option{WithPrefix(prefix), WithTimeout(5 * time.Second), WithReplicas(1, time.Second), WithBreaker(0, 0)}
	l, err := NewTokenBucket(mc, throttle.PerHour(10), 10, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admitted := 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 4 { // concurrent calls share pipelines: each ends with WAIT
		wg.Go(func() {
			for range 5 {
				d, err := l.Allow(ctx, "k", 1)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				admitted += btoi(d.Allowed)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if admitted != 10 {
		t.Fatalf("admitted %d of 10/h", admitted)
	}
	// Failover: the master dies at once, the replica is promoted.
	master.Kill()
	if _, err := redistest.Do(replica.Addr, time.Second, "REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	rc := newClient(t, replica)
	after, err := NewTokenBucket(rc, throttle.PerHour(10), 10, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := after.Allow(ctx, "k", 1); err != nil || d.Allowed {
		t.Fatalf("on the promoted replica after 10 of 10/h: %+v, %v; want denied", d, err)
	}
	// The promoted server has no replica: nothing is answered admitted.
	lonely, err := NewTokenBucket(rc, throttle.PerHour(10), 10, WithPrefix(uniquePrefix()), WithTimeout(5*time.Second),
		WithReplicas(1, 20*time.Millisecond), WithBreaker(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lonely.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrUnavailable) || d.Allowed {
		t.Fatalf("WithReplicas(1) without a replica: %+v, %v; want ErrUnavailable", d, err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BenchmarkReplicas measures decisions on a master with one replica,
// without and with WithReplicas(1, ...): one caller, and 16 concurrent
// callers (whose calls share pipelines, hence WAITs).
func BenchmarkReplicas(b *testing.B) {
	master := redistest.Start(b, "--repl-diskless-sync-delay", "0")
	master.NeedOwn(b)
	replica := redistest.Start(b)
	if _, err := redistest.Do(replica.Addr, time.Second, "REPLICAOF", "127.0.0.1", fmt.Sprint(master.Port())); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // let the replica sync
	c := newClient(b, master)
	for _, wait := range []int{0, 1} {
		for _, par := range []int{1, 16} {
			b.Run(fmt.Sprintf("replicas=%d/callers=%d", wait, par), func(b *testing.B) {
				l, err := NewTokenBucket(c, throttle.PerSecond(1e9), 1e9, WithPrefix(uniquePrefix()),
					WithReplicas(wait, 50*time.Millisecond))
				if err != nil {
					b.Fatal(err)
				}
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := l.Allow(context.Background(), "k", 1); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}
