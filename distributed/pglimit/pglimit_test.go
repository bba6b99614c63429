package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/internal/pgtest"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestConformance: a table passes the Store conformance test for every
// algorithm (commits not waiting for their flush: the test is of
// decisions): throttletest's suite (but its long bound check, which the
// in-memory store runs), the same decisions as the in-process limiters on
// a random trace, and 32 goroutines on one key.
func TestConformance(t *testing.T) {
	pool := newFastPool(t, srv, 16)
	storetest.Run(t, storetest.Config{
		New:     func(t testing.TB) throttle.Store { return newStore(t, pool) },
		Steps:   600,
		NoBound: true,
	})
}

// TestContention: 48 goroutines over 16 connections race for one key of
// a fixed window of 150: exactly 150 units are admitted (no admission
// lost to a write that raced another, none counted twice), and every
// lost race was decided again rather than failed.
func TestContention(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(150, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	l := storetest.NewLimiter(t, newStore(t, newPool(t, srv, 16), pglimit.WithTimeout(10*time.Second)), a, throttletest.NewClock())
	storetest.Contention(t, l, 150, 48)
}

// TestSerializable: under SERIALIZABLE (and REPEATABLE READ) a write
// that races another fails with a serialization failure rather than
// waiting; the Store takes it for a lost race, so 32 goroutines on one key
// still admit exactly the limit, and none of them fails.
func TestSerializable(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(60, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			pool := newPoolWith(t, srv, 16, map[string]string{"default_transaction_isolation": level})
			var got string
			if err := pool.QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&got); err != nil || got != level {
				t.Fatalf("isolation %q, %v; want %q", got, err, level)
			}
			l := storetest.NewLimiter(t, newStore(t, pool, pglimit.WithTimeout(10*time.Second)), a, throttletest.NewClock())
			storetest.Contention(t, l, 60, 32)
		})
	}
}

// TestKeys: keys are bytes (NUL, invalid UTF-8, quotes, backslashes): no
// key is refused by the database, and each is a key of its own.
func TestKeys(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	l := storetest.NewLimiter(t, newStore(t, newPool(t, srv, 2)), a, throttletest.NewClock())
	keys := []string{"a\x00b", "a", "\xff\xfe", `'; DROP TABLE x; --`, `a\\b`, `a\b`, "ü"}
	for _, k := range keys {
		if d, err := l.Allow(context.Background(), k, 1); err != nil || !d.Allowed {
			t.Fatalf("first Allow(%q) = %+v, %v; want admitted", k, d, err)
		}
	}
	for _, k := range keys {
		if d, err := l.Allow(context.Background(), k, 1); err != nil || d.Allowed {
			t.Fatalf("second Allow(%q) = %+v, %v; want denied", k, d, err)
		}
	}
}

// TestNew: a table name that is not an identifier (an injection), a nil
// DB and a negative timeout are refused with ErrInvalid.
func TestNew(t *testing.T) {
	pool := newPool(t, srv, 1)
	for name, opts := range map[string][]pglimit.Option{
		"injection": {pglimit.WithTable("t; DROP TABLE x")},
		"quoted":    {pglimit.WithTable(`"t"`)},
		"empty":     {pglimit.WithTable("")},
		"timeout":   {pglimit.WithTimeout(-time.Second)},
		"nil":       {nil},
	} {
		if _, err := pglimit.New(pool, opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := pglimit.New(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("nil DB: %v, want ErrInvalid", err)
	}
	s, err := pglimit.New(pool, pglimit.WithTable("public.limits"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatalf("schema-qualified table: %v", err)
	}
	if _, err := pool.Exec(context.Background(), "DROP TABLE public.limits"); err != nil {
		t.Fatal(err)
	}
}

// TestSweep: Sweep deletes the rows expired before the instant given and
// keeps the others, and what it deletes decides as before (a fresh key).
func TestSweep(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 2)
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, srv, 2)
	s := newStore(t, pool)
	clk := throttletest.NewClock()
	l := storetest.NewLimiter(t, s, a, clk)
	allow := func(key string) throttle.Decision {
		t.Helper()
		d, err := l.Allow(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	allow("short") // full again after 1s
	allow("long")
	allow("long") // after 2s
	clk.Advance(1500 * time.Millisecond)
	n, err := s.Sweep(context.Background(), clk.Now())
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the one expired row", n, err)
	}
	if d := allow("long"); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the kept key after Sweep: %+v, want its state kept (1 token left, now 0)", d)
	}
	if d := allow("short"); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("the swept key: %+v, want a full bucket", d)
	}
}

// TestPoolExhausted: with every connection of the pool held elsewhere a
// decision waits at most the Store's timeout and fails with an error
// wrapping throttle.ErrUnavailable and context.DeadlineExceeded; the
// caller's own cancellation ends it sooner; once a connection is free
// again decisions resume.
func TestPoolExhausted(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 5)
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, srv, 1)
	l := storetest.NewLimiter(t, newStore(t, pool, pglimit.WithTimeout(200*time.Millisecond)), a, throttletest.NewClock())
	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Allow(context.Background(), "k", 1)
	if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exhausted pool: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, "k", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	held.Release()
	if d, err := l.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Fatalf("after the connection is back: %+v, %v", d, err)
	}
}

// TestServerKilled: while clients keep asking, the server is killed and
// restarted. Every call meanwhile ends (no hang) either decided or with
// an error wrapping throttle.ErrUnavailable; the states committed before
// the kill survive it, so with time standing still no more than the
// limit is ever admitted on the key, sampled from the clients' side, and
// after the restart the key admits exactly what was left.
func TestServerKilled(t *testing.T) {
	own := pgtest.Start(t)
	own.NeedOwn(t)
	const limit = 40
	a, err := fixedwindow.NewAlgorithm(limit, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, own, 4)
	l := storetest.NewLimiter(t, newStore(t, pool, pglimit.WithTimeout(2*time.Second)), a, throttletest.NewClock())
	var admitted, failed atomic.Int64
	stop := testproc.Repeat(4, func() bool {
		d, err := l.Allow(context.Background(), "k", 1)
		switch {
		case err != nil && !errors.Is(err, throttle.ErrUnavailable):
			t.Errorf("Allow: %v, want nil or ErrUnavailable", err)
			return false
		case err != nil:
			failed.Add(1)
		case d.Allowed:
			if admitted.Add(1) > limit {
				t.Errorf("admitted more than %d with time standing still", limit)
				return false
			}
		}
		time.Sleep(time.Millisecond)
		return true
	})
	defer stop()
	// waitFor polls cond; a minute without it fails the test (the clients
	// never hang: each call is bounded by the Store's timeout).
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond() && !t.Failed(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within a minute (%d admitted, %d failed)", what, admitted.Load(), failed.Load())
			}
		}
	}
	waitFor("admissions", func() bool { return admitted.Load() >= limit/4 })
	own.Kill()
	waitFor("failure seen by the clients", func() bool { return failed.Load() > 0 })
	if err := own.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor("admissions after the restart", func() bool { return admitted.Load() >= limit })
	time.Sleep(50 * time.Millisecond) // room for an over-admission to show
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d in all across the restart, want exactly %d", got, limit)
	}
}

// TestServerDurability: the test server runs with PostgreSQL's production
// durability (fsync, synchronous_commit and full_page_writes on), so that
// the tests and benchmarks of this package pay what a deployment pays for
// a commit.
func TestServerDurability(t *testing.T) {
	srv.NeedOwn(t)
	pool := newPool(t, srv, 1)
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		if err := pool.QueryRow(context.Background(), "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != "on" {
			t.Errorf("%s = %s, want on", name, v)
		}
	}
}

// TestCreateTableTogether: 120 replicas starting together each call
// CreateTable on the same new table: every call succeeds (before, 105 of
// 120 failed with a unique violation, SQLSTATE 23505, or a duplicate
// object, 42710, from the catalog), and the table works.
func TestCreateTableTogether(t *testing.T) {
	pool := newPool(t, srv, 60)
	name := newTableName()
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := make(chan struct{})
	var first error
	var once sync.Once
	for range 120 {
		wg.Go(func() {
			s, err := pglimit.New(pool, pglimit.WithTable(name))
			if err != nil {
				t.Error(err)
				return
			}
			<-start
			if err := s.CreateTable(context.Background()); err != nil {
				failed.Add(1)
				once.Do(func() { first = err })
			}
		})
	}
	close(start)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 120 concurrent CreateTable calls failed, the first with %v", n, first)
	}
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	l := storetest.NewLimiter(t, newStoreOn(t, pool, name), a, throttletest.NewClock())
	if d, err := l.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Fatalf("Allow on the table: %+v, %v", d, err)
	}
}

// TestLongKeys: keys longer than a B-tree entry holds (about 2.7 KB), up
// to 1 MiB, work when the limiter allows them (before, every one failed
// with ErrUnavailable, which fail-open admits and a breaker counts
// against every key); keys that differ in their last byte only, and a
// short key equal to a long one's stored form, are keys of their own.
func TestLongKeys(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := storelimit.New(newStore(t, newPool(t, srv, 2)), a, throttle.WithClock(throttletest.NewClock()), throttle.WithMaxKeyLen(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 1<<20-1)
	keys := []string{
		strings.Repeat("a", 1024), strings.Repeat("a", 1024+1),
		strings.Repeat("x", 3000) + "1", strings.Repeat("x", 3000) + "2",
		long + "1", long + "2",
		"throttle: SHA-256 of a long key\x00",
	}
	for _, want := range []bool{true, false} {
		for _, k := range keys {
			d, err := l.Allow(context.Background(), k, 1)
			if err != nil || d.Allowed != want {
				t.Fatalf("Allow(key of %d bytes) = %+v, %v; want allowed %v", len(k), d, err, want)
			}
		}
	}
}

// TestRowLocked: a transaction left open on a key's row (a stuck
// migration, a debugging session) makes the decisions on that key wait
// for its lock: each ends within the Store's timeout as a whole with an
// error wrapping ErrUnavailable and DeadlineExceeded, or, under a
// server-side statement_timeout shorter than that, with the server's
// cancellation (SQLSTATE 57014), also ErrUnavailable; other keys are not
// held up; once the transaction ends, the key decides exactly again.
func TestRowLocked(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(3, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	short := newPoolWith(t, srv, 4, map[string]string{"statement_timeout": "100"})
	pool := newPool(t, srv, 4)
	name := newTableName()
	clk := throttletest.NewClock()
	l := storetest.NewLimiter(t, newStoreOn(t, pool, name, pglimit.WithTimeout(300*time.Millisecond)), a, clk)
	ls := storetest.NewLimiter(t, newStoreOn(t, short, name), a, clk)
	if d, err := l.Allow(ctx, "k", 1); err != nil || !d.Allowed {
		t.Fatalf("first Allow: %+v, %v", d, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+name+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		l    *storelimit.Limiter
		want error
	}{{"store timeout", l, context.DeadlineExceeded}, {"statement_timeout", ls, throttle.ErrUnavailable}} {
		start := time.Now()
		_, err := c.l.Allow(ctx, "k", 1)
		if took := time.Since(start); !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, c.want) || took > time.Second {
			t.Fatalf("%s: a decision on a locked row: %v after %v, want ErrUnavailable (%v) within a second", c.name, err, took, c.want)
		}
	}
	if d, err := l.Allow(ctx, "other", 1); err != nil || !d.Allowed {
		t.Fatalf("another key while the row is locked: %+v, %v", d, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	admitted := 1 // before the lock; the failed calls may have been charged (at most 2)
	for {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		admitted++
	}
	if admitted != 3 {
		t.Fatalf("admitted %d in all after the lock ended, want 3 (the failed calls charged nothing: their statements were cancelled)", admitted)
	}
}

// TestTableGrowth: keys that come and go on a moving clock (100 new keys
// every 1.5 s, 6 times, each full again a second after its call) leave
// their rows behind only until Sweep: the table does not grow, each
// Sweep deleting every row expired.
func TestTableGrowth(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 10) // full again 1s after a call
	if err != nil {
		t.Fatal(err)
	}
	pool := newFastPool(t, srv, 4)
	name := newTableName()
	s := newStoreOn(t, pool, name)
	clk := throttletest.NewClock()
	l := storetest.NewLimiter(t, s, a, clk)
	ctx := context.Background()
	for sec := range 6 {
		for i := range 100 {
			if _, err := l.Allow(ctx, fmt.Sprintf("s%d-k%d", sec, i), 1); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(1500 * time.Millisecond)
		if _, err := s.Sweep(ctx, clk.Now()); err != nil {
			t.Fatal(err)
		}
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != 0 {
			t.Fatalf("after second %d and a Sweep: %d rows, want 0 (every key expired)", sec, rows)
		}
	}
}
