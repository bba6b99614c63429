package adaptive

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestKeyedKeysAreIndependent: drops on one downstream lower its limit
// only; bad keys and keys past WithMaxKeys are refused without touching
// the known ones.
func TestKeyedKeysAreIndependent(t *testing.T) {
	clk := throttletest.NewClock()
	k, err := NewKeyed(func() Algorithm { return &AIMD{Backoff: 0.5} }, Config{Initial: 10, WindowSamples: 1},
		throttle.WithClock(clk), throttle.WithMaxKeys(2), throttle.WithMaxKeyLen(8))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b"} {
		if d, err := k.Allow(bg, key, 1); err != nil || !d.Allowed {
			t.Fatalf("Allow(%s) = %+v, %v", key, d, err)
		}
	}
	clk.Advance(time.Second)
	if err := k.Release("a", 1, time.Second, Dropped); err != nil {
		t.Fatal(err)
	}
	la, _ := k.Limiter("a")
	lb, _ := k.Limiter("b")
	if la.Limit() != 5 || lb.Limit() != 10 {
		t.Fatalf("limits a %d, b %d; want 5 and 10", la.Limit(), lb.Limit())
	}
	for _, bad := range []string{"", strings.Repeat("x", 9), "c"} {
		if _, err := k.Allow(bg, bad, 1); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("Allow(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, release, err := k.TryHold(bg, "b", 1); err != nil {
		t.Fatal(err)
	} else {
		release()
	}
	if lb.InFlight() != 1 {
		t.Fatalf("b in flight %d, want 1", lb.InFlight())
	}
}

// TestKeyedRacingNewKeys: goroutines racing to make the same keys share
// one limiter per key and never pass WithMaxKeys.
func TestKeyedRacingNewKeys(t *testing.T) {
	k, err := NewKeyed(func() Algorithm { return &Vegas{} }, Config{}, throttle.WithMaxKeys(3))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, key := range []string{"a", "b", "c", "d", "e"} {
				k.Allow(bg, key, 1)
			}
		})
	}
	wg.Wait()
	held := 0
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		if l, err := k.Limiter(key); err == nil {
			held += l.InFlight()
		}
	}
	if n := k.n.Load(); n != 3 || held != 24 {
		t.Fatalf("%d keys holding %d units, want 3 keys holding 24", n, held)
	}
}

func TestKeyedAllocs(t *testing.T) {
	if raceOn {
		t.Skip("allocations differ under the race detector")
	}
	k, err := NewKeyed(func() Algorithm { return &AIMD{} }, Config{})
	if err != nil {
		t.Fatal(err)
	}
	k.Allow(bg, "db", 1)
	k.Release("db", 1, time.Millisecond, Success)
	if n := testing.AllocsPerRun(1000, func() {
		k.Allow(bg, "db", 1)
		k.Release("db", 1, time.Millisecond, Success)
	}); n != 0 {
		t.Errorf("%v allocs per Allow+Release of a known key", n)
	}
}
