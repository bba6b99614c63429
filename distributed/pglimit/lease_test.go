package pglimit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/internal/pgtest"
	"github.com/throttlekit/throttle/internal/testproc"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Leasing under faults, with fsync on. Time stands still (a virtual clock,
// or a rate of one unit per second), so a key's bound is its burst: the
// processes sharing the key never admit more (every leased unit is
// charged in the store before it is spent), and admit less only by the
// stated under-admission: the units of leases whose reply was lost, and
// those a crashed process held, at most two batches per process.
const (
	leaseBurst = 200
	leaseBatch = 16
)

// lossy is a Store that loses the reply of every third swap after the
// database executed it (a connection lost after the commit), and counts
// the swaps lost that took effect.
type lossy struct {
	throttle.LoadingStore
	calls, lost atomic.Int64
}

var errLostReply = errors.New("reply lost")

func (s *lossy) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	state, ok, err := s.LoadingStore.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	if err == nil && s.calls.Add(1)%3 == 0 {
		if ok {
			s.lost.Add(1)
		}
		return 0, false, errLostReply
	}
	return state, ok, err
}

// drainLeased runs workers goroutines on each of ls, asking key for one
// unit of the key "hot" until each has seen 20 denials in a row, and returns the units
// admitted (adding them to a as they come) and the calls that failed; a
// failure other than ErrUnavailable fails t.
func drainLeased(t *testing.T, ls []*storelimit.Limiter, workers int, pause time.Duration, a *atomic.Int64) (admitted, failed int64) {
	t.Helper()
	start := a.Load()
	var f atomic.Int64
	var wg sync.WaitGroup
	for _, l := range ls {
		for range workers {
			wg.Go(func() {
				for denials := 0; denials < 20; time.Sleep(pause) {
					d, err := l.Allow(context.Background(), "hot", 1)
					switch {
					case err != nil && !errors.Is(err, throttle.ErrUnavailable):
						t.Errorf("Allow: %v, want nil or ErrUnavailable", err)
						return
					case err != nil:
						f.Add(1)
					case d.Allowed:
						a.Add(1)
						denials = 0
					default:
						denials++
					}
				}
			})
		}
	}
	wg.Wait()
	return a.Load() - start, f.Load()
}

// newLeasing returns n leasing limiters (as n processes) of a token bucket
// of burst leaseBurst over s, on clk (nil: the real clock).
func newLeasing(t *testing.T, s throttle.Store, n int, rate throttle.Rate, clk throttle.Clock) []*storelimit.Limiter {
	t.Helper()
	alg, err := tokenbucket.NewAlgorithm(rate, leaseBurst)
	if err != nil {
		t.Fatal(err)
	}
	var opts []throttle.Option
	if clk != nil {
		opts = append(opts, throttle.WithClock(clk))
	}
	ls := make([]*storelimit.Limiter, n)
	for i := range ls {
		if ls[i], err = storelimit.NewLeasing(s, alg, leaseBatch, time.Hour, opts...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ls[i].Close() })
	}
	return ls
}

// TestLeasingLostReplies: four leasing processes lose the reply of every
// third lease; they admit at most the burst, and at least the burst less
// a batch per lost lease that took effect (and less than a half batch
// left in the store, which no process asks for with time standing still).
func TestLeasingLostReplies(t *testing.T) {
	s := &lossy{LoadingStore: newStore(t, newPool(t, srv, 8))}
	ls := newLeasing(t, s, 4, throttle.PerSecond(1), throttletest.NewClock())
	admitted, failed := drainLeased(t, ls, 2, 0, new(atomic.Int64))
	t.Logf("admitted %d of %d, %d calls failed, %d of %d swaps lost after taking effect", admitted, leaseBurst, failed, s.lost.Load(), s.calls.Load())
	if admitted > leaseBurst {
		t.Fatalf("admitted %d, above the burst %d", admitted, leaseBurst)
	}
	if lo := leaseBurst - s.lost.Load()*leaseBatch - leaseBatch/2; admitted < lo {
		t.Fatalf("admitted %d, below burst - lost leases × batch - half a batch = %d", admitted, lo)
	}
}

// TestLeasingServerKilled: two leasing processes run while the server is
// killed and restarted; they decide from their leases meanwhile, and
// admit at most the burst in all, at least the burst less two batches
// each (leases whose commit the kill left unanswered).
func TestLeasingServerKilled(t *testing.T) {
	own := pgtest.Start(t)
	own.NeedOwn(t)
	s := newStore(t, newPool(t, own, 4), pglimit.WithTimeout(2*time.Second))
	ls := newLeasing(t, s, 2, throttle.PerSecond(1), throttletest.NewClock())
	var admitted atomic.Int64
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for admitted.Load() < leaseBurst/4 {
			time.Sleep(time.Millisecond)
		}
		own.Kill()
		time.Sleep(300 * time.Millisecond)
		if err := own.Restart(); err != nil {
			t.Error(err)
		}
	}()
	var failed int64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !t.Failed(); {
		_, f := drainLeased(t, ls, 2, time.Millisecond, &admitted)
		failed += f
		select {
		case <-restarted:
			if f == 0 {
				deadline = time.Time{} // drained on a server that answered every call
			}
		default:
		}
	}
	<-restarted
	got := admitted.Load()
	t.Logf("admitted %d of %d across the kill and restart, %d calls failed", got, leaseBurst, failed)
	if got > leaseBurst {
		t.Fatalf("admitted %d, above the burst %d", got, leaseBurst)
	}
	if lo := int64(leaseBurst - 2*2*leaseBatch); got < lo {
		t.Fatalf("admitted %d, below burst - 2 batches per process = %d", got, lo)
	}
}

// TestLeasingProcessCrash: a process admits a few units from its lease
// and is killed (SIGKILL) holding the rest; the survivors admit at most
// the burst with it, at least the burst less its two batches.
func TestLeasingProcessCrash(t *testing.T) {
	h := hotSpec(t, 1, 1, time.Minute)
	h.Burst, h.Lease, h.Crash = leaseBurst, leaseBatch, 5
	h.Start = time.Now().UnixNano()
	spec, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := testproc.Self([]string{hotChildEnv + "=" + string(spec)}, "-test.run=^$")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadBytes('\n')
	cmd.Process.Kill()
	cmd.Wait()
	var child hotLoad
	if err == nil {
		err = json.Unmarshal(line, &child)
	}
	if err != nil || child.Err != "" {
		t.Fatalf("child: %v %s", err, child.Err)
	}
	s := newStoreOn(t, newPool(t, srv, 4), h.Table)
	ls := newLeasing(t, s, 2, throttle.PerSecond(1), nil)
	rest, failed := drainLeased(t, ls, 2, 0, new(atomic.Int64))
	refill := int64(time.Since(start).Seconds()) + 1 // one unit a second
	t.Logf("the killed process admitted %d, the others %d (%d failed): %d of %d", child.Admitted, rest, failed, child.Admitted+rest, leaseBurst)
	if sum := child.Admitted + rest; sum > leaseBurst+refill {
		t.Fatalf("admitted %d in all, above the burst %d (+%d refilled)", sum, leaseBurst, refill)
	} else if sum < leaseBurst-2*leaseBatch {
		t.Fatalf("admitted %d in all, below the burst less the killed process's two batches", sum)
	}
}
