package storelimit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/lease/leasetest"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestLeasingBound runs four processes (leasing limiters sharing one
// store) on one key on a virtual-time trace and checks the stated bound
// on every interval: from the fresh start at most burst + Events(d), and
// in any interval of length d at most burst + Events(d + maxAge); and
// that leasing spares most calls to the store.
func TestLeasingBound(t *testing.T) {
	const (
		procs    = 4
		maxBatch = 16
		burst    = 50
		maxAge   = 50 * time.Millisecond
	)
	rate := throttle.PerSecond(2000)
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(3) {
		clk := throttletest.NewClock()
		var calls atomic.Int64
		store := storetest.Counted(new(storelimit.Memory), &calls)
		ls := make([]*storelimit.Limiter, procs)
		for i := range ls {
			l, err := storelimit.NewLeasing(store, alg, maxBatch, maxAge, throttle.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ls[i] = l
		}
		const decisions = 6000
		at, elapsed := leasetest.Trace(t, ls, clk, seed, decisions)
		t.Logf("seed %d: %d decisions, %d units admitted in %v (bucket bound %d), %d store calls",
			seed, decisions, len(at), elapsed, burst+rate.Events(elapsed), calls.Load())
		if calls.Load()*3 > decisions {
			t.Errorf("seed %d: %d store calls for %d decisions: leasing should spare most", seed, calls.Load(), decisions)
		}
		leasetest.CheckBound(t, at, burst, rate, maxAge, 0, 0)
	}
}

// storeLeft returns the units alg would admit to key at now on the state
// in store.
func storeLeft(t *testing.T, store storelimit.Store, alg storelimit.Algorithm, key string, now time.Time) int {
	t.Helper()
	state, err := store.Load(context.Background(), key, now.UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	_, d, err := alg.Decide(state+alg.Fresh(), now.UnixNano(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining + boolInt(d.Allowed)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestLeasingDenialLocal: over the limit, denials are decided locally,
// with a RetryAfter after which the call is admitted.
func TestLeasingDenialLocal(t *testing.T) {
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 10)
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	var calls atomic.Int64
	l, err := storelimit.NewLeasing(storetest.Counted(new(storelimit.Memory), &calls), alg, 4, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	leasetest.CheckDenialLocal(t, l, clk, calls.Load, func() { storelimit.Settle(l) })
}

func TestLeasingOptions(t *testing.T) {
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		batch int
		age   time.Duration
	}{{0, 0}, {4, -time.Second}} {
		if _, err := storelimit.NewLeasing(new(storelimit.Memory), alg, c.batch, c.age); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewLeasing(%d, %v): %v, want ErrInvalid", c.batch, c.age, err)
		}
	}
}

// slowMemory is a Memory whose swaps take 2 ms, as a database's commit.
type slowMemory struct{ storelimit.Memory }

func (s *slowMemory) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	time.Sleep(2 * time.Millisecond)
	return s.Memory.CompareAndSwapLoad(ctx, key, old, next, now, expires)
}

// TestLeasingLosesNoUnit: two leasing processes × 4 goroutines drain a
// key with time standing still; every unit leased is admitted: the units
// admitted and those left in the store (less than half a batch, which a
// process does not ask for while time stands still) are the burst. A
// refill used to replace a batch still being spent, dropping its units
// (194 and 196 of 200 admitted, 0 left).
func TestLeasingLosesNoUnit(t *testing.T) {
	const burst, batch = 200, 16
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), burst)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 8 { // the loss showed in about one round of three
		clk := throttletest.NewClock()
		store := new(slowMemory)
		var admitted atomic.Int64
		for range 2 {
			l, err := storelimit.NewLeasing(store, alg, batch, time.Hour, throttle.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			drain(t, l, 4, &admitted)
			l.Close()
		}
		left := int64(storeLeft(t, store, alg, "k", clk.Now()))
		if got := admitted.Load(); got+left != burst {
			t.Fatalf("round %d: admitted %d and %d left in the store, want %d in all", round, got, left, burst)
		}
	}
}

// drain runs workers goroutines asking l for one unit of "k" until each
// has seen 20 denials in a row, adding the units admitted to admitted.
func drain(t *testing.T, l throttle.Limiter, workers int, admitted *atomic.Int64) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for denials := 0; denials < 20; time.Sleep(100 * time.Microsecond) {
				d, err := l.Allow(context.Background(), "k", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
					denials = 0
				} else {
					denials++
				}
			}
		})
	}
	wg.Wait()
}

// TestLeasingHotKeyKeepsUp: one leasing process whose callers ask a
// token bucket's key far above its rate, on virtual time over an
// in-memory store: at every step, the units admitted since the key's
// fresh start fall short of the bucket's (burst + Events(t)) by at most
// 1 + Events(maxAge/8), the most a key holds in the store while the
// process denies. (A process used to wait until the key could grant half
// a batch: 128 units short with batches of 256, 0.979 of a 3 s window at
// 2,000/s.)
func TestLeasingHotKeyKeepsUp(t *testing.T) {
	const burst, maxBatch, maxAge = 1000, 256, 100 * time.Millisecond
	rate := throttle.PerSecond(2000)
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	l, err := storelimit.NewLeasing(new(storelimit.Memory), alg, maxBatch, maxAge, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start, admitted, worst := clk.Now(), int64(0), int64(0)
	for range 30000 { // 3 s in steps of 100 µs
		clk.Advance(100 * time.Microsecond)
		for allowed := true; allowed; { // ask until denied
			d, err := l.Allow(context.Background(), "hot", 1)
			if err != nil {
				t.Fatal(err)
			}
			storelimit.Settle(l)
			allowed = d.Allowed
			admitted += int64(boolInt(allowed))
		}
		short := burst + rate.Events(clk.Now().Sub(start)) - admitted
		if short < 0 {
			t.Fatalf("admitted %d by %v, above the bucket's %d", admitted, clk.Now().Sub(start), burst+rate.Events(clk.Now().Sub(start)))
		}
		worst = max(worst, short)
	}
	t.Logf("admitted %d in %v, at worst %d short of the bucket", admitted, clk.Now().Sub(start), worst)
	if bound := 1 + rate.Events(maxAge/8); worst > bound {
		t.Errorf("at worst %d units short of the bucket, want at most 1 + Events(maxAge/8) = %d", worst, bound)
	}
}

// BenchmarkLeasing: parallel decisions on one key of a leasing limiter
// over Memory: spent from the pool (a key far below its limit), and
// denied locally (a key over it).
func BenchmarkLeasing(b *testing.B) {
	for _, c := range []struct {
		name  string
		rate  throttle.Rate
		burst int
	}{{"spend", throttle.PerSecond(1_000_000_000), 1_000_000}, {"deny", throttle.NewRate(1, time.Hour), 1}} {
		b.Run(c.name, func(b *testing.B) {
			alg, err := tokenbucket.NewAlgorithm(c.rate, c.burst)
			if err != nil {
				b.Fatal(err)
			}
			l, err := storelimit.NewLeasing(new(storelimit.Memory), alg, 4096, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			l.Allow(ctx, "k", 1)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Allow(ctx, "k", 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestLeasingStallGivesBack: a leasing process holds a lease when it
// stalls longer than maxAge (descheduled, a GC pause); its next lease
// gives the expired units back to the store, which still holds the state
// the lease left, so none is lost: the units admitted and those left in
// the store are the bucket's, burst + Events(t). (They used to be
// dropped: 31 of 1,900 lost.)
func TestLeasingStallGivesBack(t *testing.T) {
	const burst, maxAge = 1000, 100 * time.Millisecond
	rate := throttle.PerSecond(2000)
	alg, err := tokenbucket.NewAlgorithm(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	store := new(storelimit.Memory)
	l, err := storelimit.NewLeasing(store, alg, 256, maxAge, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start, admitted := clk.Now(), 0
	askAll := func() {
		for allowed := true; allowed; {
			d, err := l.Allow(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			storelimit.Settle(l)
			allowed = d.Allowed
			admitted += boolInt(allowed)
		}
	}
	askAll()                           // the burst
	clk.Advance(50 * time.Millisecond) // 100 units accrue
	if d, _ := l.Allow(context.Background(), "k", 1); !d.Allowed {
		t.Fatalf("after 50 ms: %+v", d)
	}
	admitted++
	storelimit.Settle(l)
	clk.Advance(400 * time.Millisecond) // the stall: the lease expires
	askAll()
	left := storeLeft(t, store, alg, "k", clk.Now())
	if want := burst + int(rate.Events(clk.Now().Sub(start))); admitted+left != want {
		t.Fatalf("admitted %d and %d left in the store, want %d in all (%d lost)", admitted, left, want, want-admitted-left)
	}
}

// hangingMemory is a Memory over a network that answers no swap: each
// waits until its context ends. Its Timeout bounds every decision, as
// pglimit's does.
type hangingMemory struct{ storelimit.Memory }

func (s *hangingMemory) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	<-ctx.Done()
	return 0, false, ctx.Err()
}

func (s *hangingMemory) Timeout() time.Duration { return 200 * time.Millisecond }

// TestLeasingDecisionBoundedByTimeout: a leasing caller that needs a
// lease while another caller's lease is in flight on a store that does
// not answer fails within the store's timeout as a whole, with
// ErrUnavailable, and within its own deadline when that comes first. (A
// caller used to wait for the lease in flight whatever its deadline, then
// the timeout again for its own: 350 ms against 200, 148 ms against a
// deadline of 20 ms.)
func TestLeasingDecisionBoundedByTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 10)
		if err != nil {
			t.Fatal(err)
		}
		l, err := storelimit.NewLeasing(new(hangingMemory), alg, 4, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, want := range []time.Duration{200 * time.Millisecond, 20 * time.Millisecond} {
			go l.Allow(context.Background(), "k", 1) // its lease hangs 200 ms
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), want)
			start := time.Now()
			_, err := l.Allow(ctx, "k", 1)
			if took := time.Since(start); took > want || !errors.Is(err, throttle.ErrUnavailable) {
				t.Errorf("Allow took %v (%v), want ErrUnavailable within %v", took, err, want)
			}
			cancel()
			time.Sleep(time.Second) // the other caller's lease ends
		}
	})
}
