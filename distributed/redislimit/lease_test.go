package redislimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestLeasingOvershoot runs several processes (limiters sharing a prefix)
// with token leasing on one virtual-time trace and checks the stated
// bounds on every interval: at most burst + Events(d + maxAge), and at
// most burst + Events(d) + 2·maxBatch·P; from the fresh start, at most
// burst + Events(d) exactly.
func TestLeasingOvershoot(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	const (
		procs    = 4
		maxBatch = 16
		burst    = 50
		maxAge   = 50 * time.Millisecond
	)
	rate := throttle.PerSecond(2000)
	for seed := range uint64(3) {
		clk := throttletest.NewClock()
		prefix := uniquePrefix()
		ls := make([]*Bucket, procs)
		for i := range ls {
			l, err := NewTokenBucket(c, rate, burst, vclock(clk), WithPrefix(prefix), WithLeasing(maxBatch, maxAge))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ls[i] = l
		}
		rng := rand.New(rand.NewPCG(seed, 11))
		start := clk.Now()
		var at []time.Duration // one entry per admitted unit
		var decisions int64
		for range 6000 {
			clk.Advance(time.Duration(rng.Int64N(int64(400 * time.Microsecond))))
			n := 1 + rng.IntN(2)
			d, err := ls[rng.IntN(procs)].Allow(context.Background(), "api", n)
			if err != nil {
				t.Fatal(err)
			}
			decisions++
			if d.Allowed {
				for range n {
					at = append(at, clk.Now().Sub(start))
				}
			}
		}
		var trips int64
		for _, l := range ls {
			trips += l.RoundTrips()
		}
		elapsed := clk.Now().Sub(start)
		t.Logf("seed %d: %d decisions, %d units admitted in %v (bucket bound %d), %d round trips",
			seed, decisions, len(at), elapsed, burst+rate.Events(elapsed), trips)
		if trips*3 > decisions {
			t.Errorf("seed %d: %d round trips for %d decisions: leasing should spare most", seed, trips, decisions)
		}
		slices.Sort(at)
		for i := range at {
			if got, b := int64(i+1), burst+rate.Events(at[i]); got > b {
				t.Fatalf("seed %d: %d units by %v from the fresh start, bound %d", seed, got, at[i], b)
			}
			for j := i; j < len(at); j++ {
				d := at[j] - at[i]
				units := int64(j - i + 1)
				if b := burst + rate.Events(d+maxAge); units > b {
					t.Fatalf("seed %d: %d units in %v, above burst + Events(d + maxAge) = %d", seed, units, d, b)
				}
				if b := burst + rate.Events(d) + 2*maxBatch*procs; units > b {
					t.Fatalf("seed %d: %d units in %v, above burst + Events(d) + 2·maxBatch·P = %d", seed, units, d, b)
				}
			}
		}
	}
}

// TestLeasingDenialCached checks that, over the limit, denials are local
// and carry an honest RetryAfter.
func TestLeasingDenialCached(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	clk := throttletest.NewClock()
	l, err := NewTokenBucket(c, throttle.PerSecond(10), 10, vclock(clk), WithPrefix(uniquePrefix()), WithLeasing(4, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	admitted := 0
	for range 100 {
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		} else if d.RetryAfter <= 0 {
			t.Fatalf("denial without RetryAfter: %+v", d)
		}
	}
	l.lease.wg.Wait()
	if admitted != 10 {
		t.Fatalf("admitted %d with time frozen, want the burst 10", admitted)
	}
	if trips := l.RoundTrips(); trips > 10 {
		t.Fatalf("%d round trips for 100 decisions", trips)
	}
	d, _ := l.Allow(ctx, "k", 1)
	clk.Advance(d.RetryAfter)
	if d, _ := l.Allow(ctx, "k", 1); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v", d)
	}
}

func TestLeasingOptions(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	if _, err := NewFixedWindow(c, 10, time.Second, WithLeasing(4, 0)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("leasing on a fixed window: %v, want ErrInvalid", err)
	}
	if _, err := NewTokenBucket(c, throttle.PerSecond(1), 1, WithLeasing(0, 0)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("WithLeasing(0, 0): %v, want ErrInvalid", err)
	}
	l, err := NewTokenBucket(c, throttle.PerSecond(1), 1, WithLeasing(4, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
