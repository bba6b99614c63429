package storelimit_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestBatchesOnManyKeys: 64 goroutines of one process on 256 keys of a
// BatchStore whose calls take 1ms, at most 2 calls in flight: each key
// admits exactly its limit (10 of 10 asked, then none), and the swaps of
// different keys go in batches: at most 0.25 calls to the store per
// decision (one call per admission without batches).
func TestBatchesOnManyKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, workers, keys = 10, 64, 256
		a, err := fixedwindow.NewAlgorithm(limit, time.Hour, false)
		if err != nil {
			t.Fatal(err)
		}
		s := &slow{delay: time.Millisecond}
		l := storetest.NewLimiter(t, s, a, throttletest.NewClock())
		storelimit.SetBatchSlots(l, 2)
		var admitted [keys]atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range limit * keys / workers { // each key limit times in all
					k := (w + i*workers) % keys
					d, err := l.Allow(context.Background(), strconv.Itoa(k), 1)
					if err != nil || !d.Allowed {
						t.Errorf("key %d: %+v, %v; want admitted", k, d, err)
						return
					}
					admitted[k].Add(1)
				}
			})
		}
		wg.Wait()
		calls := s.calls.Load()
		for k := range keys {
			d, err := l.Allow(context.Background(), strconv.Itoa(k), 1)
			if got := admitted[k].Load(); got != limit || err != nil || d.Allowed {
				t.Fatalf("key %d: admitted %d, then %+v, %v; want exactly %d, then denied", k, got, d, err, limit)
			}
		}
		if per := float64(calls) / (limit * keys); per > 0.25 {
			t.Fatalf("%d calls to the store for %d admissions (%.2f each): not batched", calls, limit*keys, per)
		}
	})
}

// TestBatchKeyFailsAlone: in one batch, a key whose stored state no
// algorithm of the limit wrote and a key the store fails do not fail the
// others: their callers get ErrInvalid and ErrUnavailable (wrapping the
// store's error), every other caller its admission, in one call to the
// store for all of them.
func TestBatchKeyFailsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := fixedwindow.NewAlgorithm(5, time.Hour, false)
		if err != nil {
			t.Fatal(err)
		}
		clk := throttletest.NewClock()
		s := &slow{gate: make(chan struct{}), bad: "bad"}
		now := clk.Now().UnixNano()
		if ok, _ := s.Memory.CompareAndSwap(context.Background(), "forged", 0, -1, now, now+int64(time.Hour)); !ok {
			t.Fatal("could not forge")
		}
		l := storetest.NewLimiter(t, s, a, clk)
		storelimit.SetBatchSlots(l, 1)
		go l.Allow(context.Background(), "first", 1) // holds the one slot until the gate opens
		synctest.Wait()
		keys := []string{"a", "forged", "b", "bad", "c"}
		errs := make([]error, len(keys))
		ds := make([]throttle.Decision, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Go(func() { ds[i], errs[i] = l.Allow(context.Background(), k, 1) })
		}
		synctest.Wait()
		close(s.gate)
		wg.Wait()
		for i, k := range keys {
			switch k {
			case "forged":
				if !errors.Is(errs[i], throttle.ErrInvalid) {
					t.Errorf("forged key: %v, want ErrInvalid", errs[i])
				}
			case "bad":
				if !errors.Is(errs[i], throttle.ErrUnavailable) || !errors.Is(errs[i], errBadKey) {
					t.Errorf("key the store failed: %v, want ErrUnavailable wrapping its error", errs[i])
				}
			default:
				if errs[i] != nil || !ds[i].Allowed || ds[i].Remaining != 4 {
					t.Errorf("key %q in the batch: %+v, %v; want admitted, 4 left", k, ds[i], errs[i])
				}
			}
		}
		if c := s.calls.Load(); c != 2 {
			t.Errorf("%d calls to the store, want 2 (the first key's, then one batch)", c)
		}
	})
}

// TestBatchWaitBoundedByDeadline: swaps waiting for a batch, and a batch
// held at the store, end with their callers' deadlines (the store's
// Timeout bounding each decision as a whole): ErrUnavailable and
// DeadlineExceeded, never later.
func TestBatchWaitBoundedByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := fixedwindow.NewAlgorithm(5, time.Hour, false)
		if err != nil {
			t.Fatal(err)
		}
		s := &slow{gate: make(chan struct{}), timeout: 50 * time.Millisecond, delay: time.Hour}
		l := storetest.NewLimiter(t, s, a, throttletest.NewClock())
		storelimit.SetBatchSlots(l, 1)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 6 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(10+5*i)*time.Millisecond)
			defer cancel()
			wg.Go(func() {
				_, err := l.Allow(ctx, strconv.Itoa(i), 1)
				dl, _ := ctx.Deadline()
				if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || time.Now().After(dl) {
					t.Errorf("call %d: %v after %v, want ErrUnavailable and DeadlineExceeded by its deadline", i, err, time.Since(start))
				}
			})
			synctest.Wait()
		}
		wg.Wait()
		close(s.gate)
	})
}
