package storelimit_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/failsafe"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/storelimit/storetest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMemory: the in-memory Store passes the conformance test, as a
// LoadingStore and as a plain Store (read, then swap).
func TestMemory(t *testing.T) {
	storetest.Run(t, storetest.Config{New: func(testing.TB) throttle.Store { return new(storelimit.Memory) }})
	t.Run("plain", func(t *testing.T) {
		storetest.Run(t, storetest.Config{New: func(testing.TB) throttle.Store { return plain{new(storelimit.Memory)} }})
	})
}

// plain hides the Memory's CompareAndSwapLoad: a Store only.
type plain struct{ m *storelimit.Memory }

func (p plain) Load(ctx context.Context, key string, now int64) (int64, error) {
	return p.m.Load(ctx, key, now)
}
func (p plain) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	return p.m.CompareAndSwap(ctx, key, old, next, now, expires)
}

// TestGuessesHoldManyKeys: a limiter keeps guesses for 1000 keys (of 4096
// slots): three admissions on each take at most 1.1 calls to the store
// per decision. (The slots were indexed by an odd hash, so half stayed
// empty, and a new key took a way at random even beside an empty one:
// 1.27 calls per decision.)
func TestGuessesHoldManyKeys(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.Every(time.Hour), 100)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	l := storetest.NewLimiter(t, storetest.Counted(new(storelimit.Memory), &calls), a, throttletest.NewClock())
	const keys = 1000
	for i := range 3 * keys {
		if d, err := l.Allow(context.Background(), "k"+strconv.Itoa(i%keys), 1); err != nil || !d.Allowed {
			t.Fatalf("Allow = %+v, %v", d, err)
		}
	}
	if got := float64(calls.Load()) / (3 * keys); got > 1.1 {
		t.Fatalf("%.3f calls to the store per decision, want at most 1.1", got)
	}
}

// TestOneCallPerAdmission: on a LoadingStore an admission takes one call
// to the store once the limiter has seen the key's state; a denial one
// call; a state changed by another writer one call more, and the
// decisions stay exact (100 units of a bucket of 100, both limiters
// together).
func TestOneCallPerAdmission(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.Every(time.Hour), 100)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	s := storetest.Counted(new(storelimit.Memory), &calls)
	clk := throttletest.NewClock()
	l := storetest.NewLimiter(t, s, a, clk)
	other := storetest.NewLimiter(t, s, a, clk)
	ctx := context.Background()
	allow := func(l *storelimit.Limiter) bool {
		t.Helper()
		d, err := l.Allow(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	allow(l) // learns the key
	calls.Store(0)
	for range 49 {
		allow(l)
	}
	if got := calls.Load(); got != 49 {
		t.Fatalf("49 admissions took %d calls to the store, want 49", got)
	}
	calls.Store(0)
	allow(other) // a guess of a fresh key: the swap fails and returns the state
	allow(l)     // its guess is stale now
	if got := calls.Load(); got != 4 {
		t.Fatalf("two admissions on stale guesses took %d calls, want 4", got)
	}
	admitted := 52
	for allow(l) {
		admitted++
	}
	if admitted != 100 {
		t.Fatalf("admitted %d of a bucket of 100", admitted)
	}
	calls.Store(0)
	if allow(l) || allow(other) || calls.Load() != 2 {
		t.Fatalf("two denials took %d calls, want 2", calls.Load())
	}
}

// faulty fails every call with err, or, with err nil, loses every
// compare-and-swap as if another writer always came first.
type faulty struct{ err error }

func (f faulty) Load(context.Context, string, int64) (int64, error) { return 0, f.err }
func (f faulty) CompareAndSwap(context.Context, string, int64, int64, int64, int64) (bool, error) {
	return false, f.err
}

// TestFailures: a failing store's error is returned wrapping
// throttle.ErrUnavailable and the store's own error; a key that stays
// contended ends in ErrUnavailable after maxAttempts (1000), not in a hang; bad
// input is refused before the store is asked.
func TestFailures(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("connection refused")
	l, err := storelimit.New(faulty{boom}, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, boom) {
		t.Fatalf("failing store: %v, want ErrUnavailable wrapping the store's error", err)
	}
	for _, c := range []struct {
		key  string
		n    int
		want error
	}{{"", 1, throttle.ErrInvalid}, {"k", 0, throttle.ErrInvalid}, {"k", 4, throttle.ErrExceedsLimit}} {
		if _, err := l.Allow(context.Background(), c.key, c.n); !errors.Is(err, c.want) {
			t.Errorf("Allow(%q, %d) on a failing store: %v, want %v", c.key, c.n, err, c.want)
		}
	}
	l, err = storelimit.New(faulty{}, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("always contended: %v, want ErrUnavailable", err)
	}
	if _, err := new(storelimit.Limiter).Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("zero Limiter: %v", err)
	}
}

// TestNewRefuses: options the limiter does not read, a missing store or
// algorithm and a zero Algorithm are refused with ErrInvalid.
func TestNewRefuses(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(5, time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	m := new(storelimit.Memory)
	for name, f := range map[string]func() (*storelimit.Limiter, error){
		"WithMaxKeys": func() (*storelimit.Limiter, error) { return storelimit.New(m, a, throttle.WithMaxKeys(10)) },
		"WithSweepInterval": func() (*storelimit.Limiter, error) {
			return storelimit.New(m, a, throttle.WithSweepInterval(time.Second))
		},
		"nil store":      func() (*storelimit.Limiter, error) { return storelimit.New(nil, a) },
		"nil algorithm":  func() (*storelimit.Limiter, error) { return storelimit.New(m, nil) },
		"zero algorithm": func() (*storelimit.Limiter, error) { return storelimit.New(m, fixedwindow.Algorithm{}) },
	} {
		if _, err := f(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	l, err := storelimit.New(m, a, throttle.WithMaxKeyLen(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "long", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("key over WithMaxKeyLen: %v", err)
	}
	if q := l.Quota(); q != (throttle.Quota{Limit: 5, Window: time.Second}) {
		t.Fatalf("Quota = %+v", q)
	}
}

// TestForgedState: a stored state no Algorithm of the limit wrote (a row
// edited by hand, another limit's state under the same key) is an error
// wrapping ErrInvalid for that key only.
func TestForgedState(t *testing.T) {
	a, err := fixedwindow.NewAlgorithm(5, time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	m := new(storelimit.Memory)
	now := clk.Now().UnixNano()
	if ok, _ := m.CompareAndSwap(context.Background(), "forged", 0, -1, now, now+int64(time.Hour)); !ok {
		t.Fatal("could not forge")
	}
	l := storetest.NewLimiter(t, m, a, clk)
	if _, err := l.Allow(context.Background(), "forged", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("forged state: %v, want ErrInvalid", err)
	}
	if d, err := l.Allow(context.Background(), "other", 1); err != nil || !d.Allowed {
		t.Fatalf("another key beside a forged one: %+v, %v", d, err)
	}
}

// TestMemorySweep: Sweep drops what expired, and only that.
func TestMemorySweep(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	m := new(storelimit.Memory)
	l := storetest.NewLimiter(t, m, a, clk)
	for _, k := range []string{"a", "b"} {
		if _, err := l.Allow(context.Background(), k, 1); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(500 * time.Millisecond)
	if _, err := l.Allow(context.Background(), "b", 1); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(clk.Now().Add(time.Second + time.Nanosecond).UnixNano()); n != 1 || storelimit.MemorySize(m) != 1 {
		t.Fatalf("Sweep dropped %d, %d left; want a's state dropped, b's kept", n, storelimit.MemorySize(m))
	}
}

// script is a store whose every compare-and-swap loses and whose second
// Load fails.
type script struct{ loads atomic.Int32 }

func (s *script) Load(context.Context, string, int64) (int64, error) {
	if s.loads.Add(1) > 1 {
		return 0, errBoom
	}
	return 0, nil
}
func (s *script) CompareAndSwap(context.Context, string, int64, int64, int64, int64) (bool, error) {
	return false, nil
}

var errBoom = errors.New("boom")

// TestLoadFailsOnRetry: a Load that fails after a lost compare-and-swap
// ends the decision with the store's error; it is not taken for a fresh
// key and tried again.
func TestLoadFailsOnRetry(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	s := new(script)
	l, err := storelimit.New(s, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k", 1); !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, errBoom) {
		t.Fatalf("Allow: %v, want the failed Load's error", err)
	}
	if n := s.loads.Load(); n != 2 {
		t.Fatalf("%d Loads, want 2 (none after the failure)", n)
	}
}

// TestZeroAlgorithms: every zero Algorithm of the module refuses to
// decide, reports a zero Quota, and is refused by New.
func TestZeroAlgorithms(t *testing.T) {
	for _, a := range []throttle.Algorithm{tokenbucket.Algorithm{}, leakybucket.Algorithm{}, fixedwindow.Algorithm{}, slidingwindow.Algorithm{}} {
		if _, _, err := a.Decide(a.Fresh(), 0, 1); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("zero %T: Decide err = %v, want ErrInvalid", a, err)
		}
		if q := a.Quota(); q != (throttle.Quota{}) {
			t.Errorf("zero %T: Quota = %+v", a, q)
		}
		if _, err := storelimit.New(new(storelimit.Memory), a); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("zero %T: New err = %v, want ErrInvalid", a, err)
		}
	}
}

// TestFailsafe: a store failure reaches failsafe as ErrUnavailable, so
// its policy decides (here: fail open).
func TestFailsafe(t *testing.T) {
	a, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := storelimit.New(faulty{errBoom}, a)
	if err != nil {
		t.Fatal(err)
	}
	f, err := failsafe.New(l, failsafe.WithPolicy(failsafe.Open))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := f.Allow(context.Background(), "k", 1); err != nil || !d.Allowed {
		t.Fatalf("failsafe(Open) over a failing store: %+v, %v; want allowed", d, err)
	}
	if _, ok := f.(throttle.QuotaReporter); !ok {
		t.Fatal("failsafe over storelimit lost QuotaReporter")
	}
}
