package tokenbucket

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestEvictedKeyNotFresh: a 1/hour key evicted by the MaxKeys cap must
// not come back as a fresh bucket; new keys are denied only while debts
// they share a table cell with are unpaid, and none once the limit's
// horizon has passed.
func TestEvictedKeyNotFresh(t *testing.T) {
	throttletest.Eviction(t, time.Hour, func(clk *throttletest.Clock, limit, maxKeys int) (throttle.Limiter, error) {
		return New(throttle.NewRate(limit, time.Hour), limit, throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys))
	})
}

// TestFloodFalseDenials measures (go test -v) the share of new keys denied
// during floods of 2× and 10× MaxKeys distinct keys, each taking one unit
// of a burst of 10 (a typical flood) or the whole burst of 1 (the worst
// case: every evicted key leaves a full debt).
func TestFloodFalseDenials(t *testing.T) {
	for _, burst := range []int{10, 1} {
		for _, maxKeys := range []int{1024} {
			for _, k := range []int{2, 10} {
				clk := throttletest.NewClock()
				l, err := New(throttle.NewRate(burst, time.Hour), burst, throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys))
				if err != nil {
					t.Fatal(err)
				}
				flood := k * maxKeys
				denied := throttletest.FalseDenials(l, fmt.Sprint("f", k), max(1, burst/10), flood)
				t.Logf("burst %d, MaxKeys %d, flood of %d new keys taking %d unit(s): %d denied (%.1f%%)", burst, maxKeys, flood, max(1, burst/10), denied, 100*float64(denied)/float64(flood))
				// A new key is denied only where ten or more evicted keys'
				// debts merged in its cell: rare, and it depends on the
				// map's hash seeds (0 to 2 of 20,480 over 300 runs).
				if burst == 10 && denied > flood/1000 {
					t.Errorf("a flood taking 1 of 10 units denied %d of %d new keys, want at most 0.1%%", denied, flood)
				}
				clk.Advance(time.Hour)
				if d := throttletest.FalseDenials(l, "after", burst, maxKeys); d != 0 {
					t.Errorf("%d new keys denied after the horizon", d)
				}
				l.Close()
			}
		}
	}
}

// FuzzNoBypass: with a cap of 4 keys on 16, the limiter never admits what
// an unbounded one holding the same admissions would deny.
func FuzzNoBypass(f *testing.F) {
	throttletest.FuzzNoBypass(f, 1, time.Millisecond, func(_, burst int, opts ...throttle.Option) (throttle.Limiter, error) {
		return New(throttle.NewRate(1, 64*time.Millisecond), burst, opts...)
	})
}

// TestTokensDuringRebuilds: Tokens reads a key's state while inserts of
// other keys keep moving the states to rebuilt tables; it must never see
// the empty bucket as full (a moved state is dead in the old table).
func TestTokensDuringRebuilds(t *testing.T) {
	clk := throttletest.NewClock()
	l, err := New(throttle.NewRate(1, time.Hour), 5, throttle.WithClock(clk), throttle.WithMaxKeys(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if d, _ := l.Allow(context.Background(), "hot", 5); !d.Allowed {
		t.Fatal("hot: first 5 denied")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			l.Allow(context.Background(), fmt.Sprint("k", i), 1)
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if n := l.Tokens("hot"); n != 0 {
			t.Fatalf("Tokens(hot) = %d during a rebuild, want 0", n)
		}
	}
}
