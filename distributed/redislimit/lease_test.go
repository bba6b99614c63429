package redislimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/lease/leasetest"
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
		const decisions = 6000
		at, elapsed := leasetest.Trace(t, ls, clk, seed, decisions)
		var trips int64
		for _, l := range ls {
			trips += l.roundTrips()
		}
		t.Logf("seed %d: %d decisions, %d units admitted in %v (bucket bound %d), %d round trips",
			seed, decisions, len(at), elapsed, burst+rate.Events(elapsed), trips)
		if trips*3 > decisions {
			t.Errorf("seed %d: %d round trips for %d decisions: leasing should spare most", seed, trips, decisions)
		}
		leasetest.CheckBound(t, at, burst, rate, maxAge, maxBatch, procs)
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
	leasetest.CheckDenialLocal(t, l, clk, l.roundTrips, l.lease.Close)
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
