package pglimit_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestBatchSwaps: one statement swaps each key of a batch as
// CompareAndSwapLoad would: a live state still the old one, an expired
// or a new key from 0, a key over 1 KiB (stored as its digest, distinct
// from another with the same first 3000 bytes); a stale old state or a
// key without a live row is not swapped and returns the key's state.
func TestBatchSwaps(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, newPool(t, srv, 2))
	now, hour := time.Now().UnixNano(), int64(time.Hour)
	long1, long2 := strings.Repeat("x", 3000)+"1", strings.Repeat("x", 3000)+"2"
	for _, c := range []struct {
		key          string
		state, since int64
	}{{"live", 5, 0}, {"expired", 7, 2 * hour}, {"expired2", 8, 2 * hour}, {long1, 9, 0}} {
		if _, ok, err := s.CompareAndSwapLoad(ctx, c.key, 0, c.state, now-c.since, now-c.since+hour); !ok || err != nil {
			t.Fatalf("setting %.10q: %v, %v", c.key, ok, err)
		}
	}
	swaps := []storelimit.Swap{
		{Key: "live", Old: 5, Next: 6},
		{Key: "expired", Old: 0, Next: 11},
		{Key: "new", Old: 0, Next: 12},
		{Key: long1, Old: 8, Next: 13},
		{Key: long2, Old: 0, Next: 14},
		{Key: "absent", Old: 3, Next: 15},
		{Key: "expired2", Old: 8, Next: 16},
	}
	for i := range swaps {
		swaps[i].Now, swaps[i].Expires = now, now+hour
	}
	if err := s.CompareAndSwapBatch(ctx, swaps); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		swapped      bool
		state, after int64
	}{{true, 0, 6}, {true, 0, 11}, {true, 0, 12}, {false, 9, 9}, {true, 0, 14}, {false, 0, 0}, {false, 0, 0}}
	for i, w := range want {
		sw := swaps[i]
		after, err := s.Load(ctx, sw.Key, now)
		if sw.Err != nil || err != nil || sw.Swapped != w.swapped || (!sw.Swapped && sw.State != w.state) || after != w.after {
			t.Errorf("swap %.10q from %d: swapped %v, state %d, %v; then %d, %v; want swapped %v, state %d, then %d",
				sw.Key, sw.Old, sw.Swapped, sw.State, sw.Err, after, err, w.swapped, w.state, w.after)
		}
	}
	if _, ok, err := s.CompareAndSwapLoad(ctx, "absent", 0, 17, now, now+hour); !ok || err != nil {
		t.Fatalf("a key a batch did not swap, from 0: %v, %v; want swapped", ok, err)
	}
}

// TestBatchRowRefused: a row the table refuses (a constraint) fails its
// own swap only: the others of its batch are made and reported.
func TestBatchRowRefused(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, srv, 2)
	name := newTableName()
	s := newStoreOn(t, pool, name)
	if _, err := pool.Exec(ctx, "ALTER TABLE "+name+" ADD CHECK (key <> 'bad'::bytea)"); err != nil {
		t.Fatal(err)
	}
	now, hour := time.Now().UnixNano(), int64(time.Hour)
	swaps := []storelimit.Swap{{Key: "a", Next: 1}, {Key: "bad", Next: 2}, {Key: "b", Next: 3}}
	for i := range swaps {
		swaps[i].Now, swaps[i].Expires = now, now+hour
	}
	if err := s.CompareAndSwapBatch(ctx, swaps); err != nil {
		t.Fatal(err)
	}
	var pg *pgconn.PgError
	if !errors.As(swaps[1].Err, &pg) || pg.Code != "23514" {
		t.Errorf("the refused key: %v, want its check violation", swaps[1].Err)
	}
	for _, i := range []int{0, 2} {
		if got, err := s.Load(ctx, swaps[i].Key, now); !swaps[i].Swapped || swaps[i].Err != nil || got != swaps[i].Next || err != nil {
			t.Errorf("key %q beside it: swapped %v, %v; then %d, %v; want swapped, then %d", swaps[i].Key, swaps[i].Swapped, swaps[i].Err, got, err, swaps[i].Next)
		}
	}
}

// batchCounted is a Store counting its batches and the swaps in them.
type batchCounted struct {
	*pglimit.Store
	batches, swaps *atomic.Int64
}

func (s batchCounted) CompareAndSwapBatch(ctx context.Context, swaps []storelimit.Swap) error {
	s.batches.Add(1)
	s.swaps.Add(int64(len(swaps)))
	return s.Store.CompareAndSwapBatch(ctx, swaps)
}

// batchRun runs procs processes (limiters of a over pools of their own on
// one table) × workers goroutines, each calling its keys in turn until
// done says stop, and returns each key's admissions (the start and end of
// each call) and the statements per decision. It fails t unless the swaps
// went in batches and took at most 2 statements per decision.
func batchRun(t *testing.T, a storelimit.Algorithm, clk throttle.Clock, procs, workers, keys int, done func(calls int) bool) (map[int][]call, float64) {
	name := newTableName()
	var statements, batches, batched, decisions atomic.Int64
	var mu sync.Mutex
	admitted := make(map[int][]call)
	var wg sync.WaitGroup
	for range procs {
		s := newStoreOn(t, newPool(t, srv, int32(workers)), name, pglimit.WithTimeout(10*time.Second))
		var opts []throttle.Option
		if clk != nil {
			opts = append(opts, throttle.WithClock(clk))
		}
		l, err := storelimit.New(storetest.Counted(batchCounted{s, &batches, &batched}, &statements), a, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for w := range workers {
			wg.Go(func() {
				for i := w; !done(i - w); i++ {
					k, start := i%keys, time.Now()
					d, err := l.Allow(context.Background(), "k"+strconv.Itoa(k), 1)
					decisions.Add(1)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if d.Allowed || admitted[k] == nil {
						admitted[k] = append(admitted[k], call{start, time.Now(), d.Allowed})
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	per := float64(statements.Load()) / float64(decisions.Load())
	t.Logf("%d decisions, %.3f statements each; %d batches of %.1f swaps on average", decisions.Load(), per, batches.Load(), float64(batched.Load())/float64(max(batches.Load(), 1)))
	if batches.Load() == 0 || per > 2 {
		t.Errorf("%d batches, %.2f statements per decision: want batches, and at most 2 per decision", batches.Load(), per)
	}
	return admitted, per
}

// call is one call of Allow: when it started and ended, and whether it
// was admitted.
type call struct {
	start, end time.Time
	allowed    bool
}

// TestBatchExact: two processes × 48 goroutines on 30 keys of a fixed
// window of 40, the clock standing still, the server committing with
// fsync on: the swaps of each process go in batches, and every key admits
// exactly 40 (none lost, none twice).
func TestBatchExact(t *testing.T) {
	const limit, keys = 40, 30
	a, err := fixedwindow.NewAlgorithm(limit, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	admitted, _ := batchRun(t, a, throttletest.NewClock(), 2, 48, keys, func(calls int) bool { return calls >= 2*limit*keys/48 })
	for k := range keys {
		n := 0
		for _, c := range admitted[k] {
			if c.allowed {
				n++
			}
		}
		if n != limit {
			t.Errorf("key %d: %d admitted, want exactly %d", k, n, limit)
		}
	}
}

// TestBatchBound: two processes × 48 goroutines on 30 keys of a token
// bucket (50/s, burst 20) for 1.5 s of the real clock, fsync on: at every
// admission its callers saw, a key has admitted at most burst + rate·t
// since its first call started (t to the admission's end). (That none is
// lost is TestBatchExact's: with the clock moving, a key a loaded machine
// leaves without a decision for burst/rate loses what refills meanwhile,
// so the share of the bound admitted is logged, not asserted.)
func TestBatchBound(t *testing.T) {
	const rate, burst, keys = 50, 20, 30
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(rate), burst)
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(1500 * time.Millisecond)
	admitted, _ := batchRun(t, a, nil, 2, 48, keys, func(int) bool { return time.Now().After(stop) })
	var share float64
	for k := range keys {
		cs := admitted[k]
		t0 := cs[0].start // the first call's, admitted or not
		var got []call
		for _, c := range cs {
			if c.allowed {
				got = append(got, c)
			}
		}
		slices.SortFunc(got, func(x, y call) int { return x.end.Compare(y.end) })
		for i, c := range got {
			if bound := burst + rate*c.end.Sub(t0).Seconds(); float64(i+1) > bound+1 {
				t.Fatalf("key %d: %d admitted by %v, bound %.1f", k, i+1, c.end.Sub(t0), bound)
			}
		}
		share += float64(len(got)) / (burst + rate*stop.Sub(t0).Seconds()) / keys
	}
	t.Logf("admitted %.3f of the bound on average", share)
}

// TestBatchLockedRow: a transaction holding one key's row stalls the
// batches holding that key; every decision still ends within the Store's
// timeout as a whole, those on the locked key with ErrUnavailable and
// DeadlineExceeded, and the statement of a batch is bounded by its
// context.
func TestBatchLockedRow(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1000), 1000)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool := newPool(t, srv, 40)
	name := newTableName()
	s := newStoreOn(t, pool, name, pglimit.WithTimeout(300*time.Millisecond))
	l := newLimiter(t, s, a)
	if d, err := l.Allow(ctx, "k0", 1); err != nil || !d.Allowed {
		t.Fatalf("first Allow: %+v, %v", d, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+name+" WHERE key = 'k0'::bytea FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	bctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.CompareAndSwapBatch(bctx, []storelimit.Swap{{Key: "x", Now: now, Expires: now + 1e9, Next: 1}, {Key: "k0", Old: 0, Now: now, Expires: now + 1e9, Next: 1}})
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("a batch on a locked row: %v after %v, want its context's error within a second", err, took)
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			start := time.Now()
			_, err := l.Allow(ctx, "k"+strconv.Itoa(i%20), 1)
			took := time.Since(start)
			if took > time.Second || (i%20 == 0 && (!errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded))) {
				t.Errorf("call %d: %v after %v, want an end within the 300ms timeout (on the locked key, ErrUnavailable and DeadlineExceeded)", i, err, took)
			}
		})
	}
	wg.Wait()
}
