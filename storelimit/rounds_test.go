package storelimit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
)

// slow is a Memory whose every call (a batch too) takes a while, as a
// round trip to a database does, and that counts them; gate, when set,
// holds the first compare-and-swap until it is closed; a batch fails the
// swap of the key bad alone.
type slow struct {
	storelimit.Memory
	delay   time.Duration
	calls   atomic.Int64
	gate    chan struct{}
	timeout time.Duration
	bad     string
}

func (s *slow) Load(ctx context.Context, key string, now int64) (int64, error) {
	s.calls.Add(1)
	if err := s.wait(ctx, false); err != nil {
		return 0, err
	}
	return s.Memory.Load(ctx, key, now)
}

func (s *slow) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	_, ok, err := s.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	return ok, err
}

func (s *slow) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	if err := s.wait(ctx, s.calls.Add(1) == 1); err != nil {
		return 0, false, err
	}
	return s.Memory.CompareAndSwapLoad(ctx, key, old, next, now, expires)
}

// wait waits for the gate (when gated) and the delay, or until ctx ends,
// as a database call honours its context.
func (s *slow) wait(ctx context.Context, gated bool) error {
	if gated && s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.delay <= 0 {
		return nil
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slow) CompareAndSwapBatch(ctx context.Context, swaps []storelimit.Swap) error {
	if err := s.wait(ctx, s.calls.Add(1) == 1); err != nil {
		return err
	}
	if err := s.Memory.CompareAndSwapBatch(ctx, swaps); err != nil {
		return err
	}
	for i := range swaps {
		if swaps[i].Key == s.bad && s.bad != "" {
			swaps[i] = storelimit.Swap{Key: s.bad, Err: errBadKey}
		}
	}
	return nil
}

var errBadKey = errors.New("a key the store refuses")

func (s *slow) Timeout() time.Duration { return s.timeout }

// TestRoundsOnHotKey: 32 goroutines of one process on one key of a store
// whose calls take 200µs each are decided in rounds: exactly the limit is
// admitted with time standing still, and the store is called at most
// once per 4 decisions (each call was its own decision before, and every
// race lost cost one more).
func TestRoundsOnHotKey(t *testing.T) {
	const limit, workers = 400, 32
	a, err := fixedwindow.NewAlgorithm(limit, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &slow{delay: 200 * time.Microsecond}
	l := storetest.NewLimiter(t, s, a, throttletest.NewClock())
	var admitted, decisions atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				d, err := l.Allow(context.Background(), "hot", 1)
				decisions.Add(1)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					return
				}
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != limit {
		t.Fatalf("admitted %d, want exactly %d", admitted.Load(), limit)
	}
	if per := float64(s.calls.Load()) / float64(decisions.Load()); per > 0.25 {
		t.Fatalf("%d calls to the store for %d decisions (%.2f each), want at most 0.25", s.calls.Load(), decisions.Load(), per)
	}
}

// contended is a store that takes a millisecond per call and loses every
// compare-and-swap, as a key that other processes keep writing, with a
// timeout of 50ms.
type contended struct{}

func (contended) Load(ctx context.Context, _ string, _ int64) (int64, error) {
	time.Sleep(time.Millisecond)
	return 0, ctx.Err()
}
func (contended) CompareAndSwap(ctx context.Context, _ string, _, _, _, _ int64) (bool, error) {
	time.Sleep(time.Millisecond)
	return false, ctx.Err()
}
func (contended) Timeout() time.Duration { return 50 * time.Millisecond }

// TestDecisionBoundedByTimeout: over a Store with a Timeout, a decision
// that keeps losing its compare-and-swap ends within that timeout as a
// whole (an error wrapping ErrUnavailable and DeadlineExceeded), not after
// maxAttempts (1000) round trips each bounded by it (over a second here).
func TestDecisionBoundedByTimeout(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(10, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	l := storetest.NewLimiter(t, contended{}, a, throttletest.NewClock())
	start := time.Now()
	_, err = l.Allow(context.Background(), "k", 1)
	took := time.Since(start)
	if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if took > 250*time.Millisecond {
		t.Fatalf("a contended decision took %v, want about the store's 50ms timeout", took)
	}
}

// TestRoundLeftBehind: a call queued behind a round in flight on its key
// whose context ends leaves at once with an error wrapping ErrUnavailable
// and its context's error, and is never decided: once the round ends, the
// key has been charged the round's unit only.
func TestRoundLeftBehind(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(10, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &slow{gate: make(chan struct{})}
	l := storetest.NewLimiter(t, s, a, throttletest.NewClock())
	led := make(chan throttle.Decision)
	go func() {
		d, _ := l.Allow(context.Background(), "k", 1)
		led <- d
	}()
	for s.calls.Load() == 0 { // the round is in flight
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Allow(ctx, "k", 1)
	if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("queued call past its deadline: %v after %v, want ErrUnavailable and DeadlineExceeded at once", err, time.Since(start))
	}
	close(s.gate)
	if d := <-led; !d.Allowed {
		t.Fatalf("the round's call: %+v, want admitted", d)
	}
	if d, err := l.Allow(context.Background(), "k", 1); err != nil || d.Remaining != 8 {
		t.Fatalf("next call: %+v, %v; want admitted with 8 left (the call that left not charged)", d, err)
	}
}
