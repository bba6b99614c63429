package tokenbucket_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// suites run the conformance suite on integral and fractional intervals.
var suites = []struct {
	name  string
	rate  throttle.Rate
	burst int
}{
	{"5/s,burst10", throttle.PerSecond(5), 10},
	{"3/s,burst7", throttle.PerSecond(3), 7}, // 333333333.3 ns per token
	{"1/6s,burst1", throttle.NewRate(1, 6*time.Second), 1},
	{"2/3ns,burst50", throttle.NewRate(2, 3), 50},
}

func TestConformance(t *testing.T) {
	for _, s := range suites {
		bound := func(d time.Duration) int64 { return int64(s.burst) + s.rate.Events(d) }
		limitertest.Conformance(t, s.name, throttletest.Suite{Limit: s.burst, Bound: bound}, tokenbucket.NewBucket, tokenbucket.New, s.rate, s.burst)
	}
}

func TestConstructorErrors(t *testing.T) {
	cases := []struct {
		name  string
		rate  throttle.Rate
		burst int
		opts  []throttle.Option
	}{
		{"zero rate", throttle.Rate{}, 1, nil},
		{"negative rate", throttle.PerSecond(-1), 1, nil},
		{"zero burst", throttle.PerSecond(1), 0, nil},
		{"negative burst", throttle.PerSecond(1), -3, nil},
		{"span too long", throttle.NewRate(1, bridge.MaxPeriod), 1000, nil},
		{"nil option", throttle.PerSecond(1), 1, []throttle.Option{nil}},
		{"nil clock", throttle.PerSecond(1), 1, []throttle.Option{throttle.WithClock(nil)}},
	}
	for _, c := range cases {
		if _, err := tokenbucket.NewBucket(c.rate, c.burst, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewBucket %s: err = %v, want ErrInvalid", c.name, err)
		}
		if _, err := tokenbucket.New(c.rate, c.burst, c.opts...); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New %s: err = %v, want ErrInvalid", c.name, err)
		}
	}
}

func TestZeroValue(t *testing.T) {
	var b tokenbucket.Bucket
	limitertest.ZeroValues(t, &b, new(tokenbucket.Limiter))
	if err := b.Debit(1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Bucket Debit err = %v", err)
	}
	if err := b.SetRate(throttle.PerSecond(1)); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Bucket SetRate err = %v", err)
	}
	if _, err := b.ReserveN(1, 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Bucket ReserveN err = %v", err)
	}
	if b.Tokens() != 0 || b.Burst() != 0 {
		t.Errorf("zero Bucket Tokens %d Burst %d", b.Tokens(), b.Burst())
	}
}

// at is a step of a trace: the time since the start and the expected
// outcome.
type at struct {
	t  time.Duration
	n  int
	ok bool
}

func runTrace(t *testing.T, lim throttle.Limiter, clk *throttletest.Clock, steps []at) {
	t.Helper()
	start := clk.Now()
	for _, s := range steps {
		clk.Set(start.Add(s.t))
		d, err := lim.Allow(t.Context(), "k", s.n)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != s.ok {
			t.Fatalf("at %v n=%d: allowed %v, want %v (%+v)", s.t, s.n, d.Allowed, s.ok, d)
		}
	}
}

// TestOnceEverySixSeconds is the classic GCRA example: one request every
// 6 s, no burst beyond one.
func TestOnceEverySixSeconds(t *testing.T) {
	steps := []at{{2 * time.Second, 1, true}, {9 * time.Second, 1, true}, {14 * time.Second, 1, false}, {16 * time.Second, 1, true}}
	clk := throttletest.NewClock()
	runTrace(t, limitertest.New(t, tokenbucket.NewBucket, throttle.NewRate(1, 6*time.Second), 1, throttle.WithClock(clk)), clk, steps)
	clk = throttletest.NewClock()
	runTrace(t, limitertest.New(t, tokenbucket.New, throttle.NewRate(1, 6*time.Second), 1, throttle.WithClock(clk)), clk, steps)

	// The denial at t=14 tells the exact wait: TAT is 15, so 1 s.
	clk = throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.NewRate(1, 6*time.Second), 1, throttle.WithClock(clk))
	for _, s := range []time.Duration{2 * time.Second, 7 * time.Second, 5 * time.Second} {
		clk.Advance(s)
		b.AllowN(1)
	}
	d, _ := b.AllowN(1)
	if d.Allowed || d.RetryAfter != time.Second || d.ResetAfter != time.Second {
		t.Fatalf("at t=14: %+v, want denied, RetryAfter 1s, ResetAfter 1s", d)
	}
}

// TestSteadyOverRate sends 20 requests per second at a 10/s bucket of
// burst 5 for 10 s: 9 pass in the first 400 ms (burst 5 plus what 400 ms
// earns), then exactly every other one.
func TestSteadyOverRate(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(10), 5, throttle.WithClock(clk))
	admitted := 0
	var got []int
	for k := range 200 {
		d, err := b.AllowN(1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
			if k < 12 {
				got = append(got, k)
			}
		} else if k > 8 && k%2 == 1 {
			if d.RetryAfter != 50*time.Millisecond {
				t.Fatalf("request %d: RetryAfter %v, want 50ms", k, d.RetryAfter)
			}
		}
		clk.Advance(50 * time.Millisecond)
	}
	if want := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 10}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first admits %v, want %v", got, want)
	}
	// 5 + Events(9.95 s) = 5 + 99: the bound, met exactly.
	if admitted != 104 {
		t.Fatalf("admitted %d in 200 requests, want 104", admitted)
	}
}

// TestFractionalInterval checks PerSecond(3) (interval rounded up to
// 333333334 ns): never faster than 3/s, exactly burst at an instant.
func TestFractionalInterval(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(3), 3, throttle.WithClock(clk))
	if d, _ := b.AllowN(3); !d.Allowed || d.ResetAfter != 3*333333334 {
		t.Fatalf("AllowN(3) on a full bucket: %+v", d)
	}
	clk.Advance(time.Second - 1)
	if d, _ := b.AllowN(3); d.Allowed || d.RetryAfter != 3 {
		t.Fatalf("AllowN(3) 1ns before a second: %+v, want denied, RetryAfter 3ns", d)
	}
	clk.Advance(3)
	if d, _ := b.AllowN(3); !d.Allowed {
		t.Fatalf("AllowN(3) at RetryAfter: %+v", d)
	}
}

func TestDebitAndTokens(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(10), 10, throttle.WithClock(clk))
	if got := b.Tokens(); got != 10 {
		t.Fatalf("full Tokens = %d", got)
	}
	if err := b.Debit(25); err != nil {
		t.Fatal(err)
	}
	if got := b.Tokens(); got != -15 {
		t.Fatalf("Tokens after Debit(25) = %d, want -15", got)
	}
	d, _ := b.AllowN(1)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 1600*time.Millisecond || d.ResetAfter != 2500*time.Millisecond {
		t.Fatalf("Allow below empty: %+v", d)
	}
	clk.Advance(50 * time.Millisecond)
	if got := b.Tokens(); got != -15 { // -14.5, floored
		t.Fatalf("Tokens = %d, want -15", got)
	}
	clk.Advance(1550 * time.Millisecond)
	if got := b.Tokens(); got != 1 {
		t.Fatalf("Tokens at RetryAfter = %d, want 1", got)
	}
	if d, _ := b.AllowN(1); !d.Allowed {
		t.Fatalf("Allow at RetryAfter: %+v", d)
	}
	for _, n := range []int64{0, -1} {
		if err := b.Debit(n); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("Debit(%d) err = %v", n, err)
		}
	}
	// Huge debits saturate instead of overflowing.
	if err := b.Debit(1 << 62); err != nil {
		t.Fatal(err)
	}
	if got := b.Tokens(); got > -1e10 {
		t.Fatalf("Tokens after a huge debit = %d", got)
	}

	l := limitertest.New(t, tokenbucket.New, throttle.PerSecond(10), 10, throttle.WithClock(clk))
	if got := l.Tokens("a"); got != 10 {
		t.Fatalf("unknown key Tokens = %d", got)
	}
	if err := l.Debit("a", 12); err != nil {
		t.Fatal(err)
	}
	if got := l.Tokens("a"); got != -2 {
		t.Fatalf("Tokens(a) after Debit(12) = %d", got)
	}
	if err := l.Debit("", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Debit with empty key: %v", err)
	}
	if got := l.Tokens("b"); got != 10 {
		t.Fatalf("Tokens(b) = %d", got)
	}
}

func TestSetRateSetBurst(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(10), 10, throttle.WithClock(clk))
	b.AllowN(10) // empty: full again in 1 s
	if err := b.SetRate(throttle.PerSecond(20)); err != nil {
		t.Fatal(err)
	}
	// The 1 s debt is kept: at 20/s it stands for 20 tokens of a burst of 10.
	if got := b.Tokens(); got != -10 {
		t.Fatalf("Tokens after SetRate(20/s) = %d, want -10", got)
	}
	clk.Advance(time.Second)
	if got := b.Tokens(); got != 10 {
		t.Fatalf("Tokens 1 s later = %d, want 10 (full at the same instant)", got)
	}
	b.AllowN(4)
	if err := b.SetBurst(20); err != nil {
		t.Fatal(err)
	}
	if got, r := b.Tokens(), b.Rate(); got != 16 || r != throttle.PerSecond(20) || b.Burst() != 20 {
		t.Fatalf("after SetBurst(20): Tokens %d, Rate %v, Burst %d; want 16, 20/s, 20", got, r, b.Burst())
	}
	if err := b.SetBurst(0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("SetBurst(0) err = %v", err)
	}
	if err := b.SetRate(throttle.Rate{}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("SetRate(zero) err = %v", err)
	}
	if _, err := b.AllowN(21); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("AllowN above the new burst: %v", err)
	}

	l := limitertest.New(t, tokenbucket.New, throttle.PerSecond(10), 2, throttle.WithClock(clk))
	l.Allow(t.Context(), "k", 2)
	if err := l.SetBurst(4); err != nil {
		t.Fatal(err)
	}
	if err := l.SetRate(throttle.PerSecond(1)); err != nil {
		t.Fatal(err)
	}
	// 200 ms of debt read at 1/s is one token in use (ceil 0.2).
	if got := l.Tokens("k"); got != 3 || l.Burst() != 4 || l.Rate() != throttle.PerSecond(1) {
		t.Fatalf("Tokens(k) = %d, Burst %d, Rate %v", got, l.Burst(), l.Rate())
	}
}

func TestReserveCancel(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(10), 1, throttle.WithClock(clk))
	b.AllowN(1)
	r1, _ := b.ReserveN(1, time.Second)
	r2, _ := b.ReserveN(1, time.Second)
	if !r1.OK || !r2.OK || r1.Delay != 100*time.Millisecond || r2.Delay != 200*time.Millisecond {
		t.Fatalf("reservations %+v %+v", r1, r2)
	}
	r1.Cancel() // r2 was booked after it: no refund
	if r3, _ := b.ReserveN(1, time.Second); r3.Delay != 300*time.Millisecond {
		t.Fatalf("after cancelling a reservation with a later one: %+v", r3)
	}
	r4, _ := b.ReserveN(1, time.Second)
	r4.Cancel()
	r4.Cancel() // idempotent
	if r5, _ := b.ReserveN(1, time.Second); r5.Delay != 400*time.Millisecond {
		t.Fatalf("after cancelling the last reservation: %+v", r5)
	}
	if r, _ := b.ReserveN(1, 400*time.Millisecond); r.OK || r.Delay != 100*time.Millisecond {
		t.Fatalf("reservation beyond maxWait: %+v, want not OK, Delay 100ms", r)
	}
	if _, err := b.ReserveN(1, -1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("negative maxWait: %v", err)
	}
	// A cancel after later admissions does nothing.
	l := limitertest.New(t, tokenbucket.New, throttle.PerSecond(10), 1, throttle.WithClock(clk))
	res, _ := l.Reserve(t.Context(), "k", 1, time.Second)
	clk.Advance(time.Second)
	l.Allow(t.Context(), "k", 1)
	res.Cancel()
	if d, _ := l.Allow(t.Context(), "k", 1); d.Allowed {
		t.Fatalf("cancel of a spent reservation refunded a later admission: %+v", d)
	}
}

func TestDecisionFields(t *testing.T) {
	clk := throttletest.NewClock()
	b := limitertest.New(t, tokenbucket.NewBucket, throttle.PerSecond(4), 8, throttle.WithClock(clk))
	d, _ := b.AllowN(3)
	if d != (throttle.Decision{Allowed: true, Limit: 8, Remaining: 5, ResetAfter: 750 * time.Millisecond}) {
		t.Fatalf("AllowN(3) = %+v", d)
	}
	clk.Advance(100 * time.Millisecond) // 5.4 tokens
	d, _ = b.AllowN(6)
	if d != (throttle.Decision{Limit: 8, Remaining: 5, RetryAfter: 150 * time.Millisecond, ResetAfter: 650 * time.Millisecond}) {
		t.Fatalf("AllowN(6) = %+v", d)
	}
}

func TestSweeperStopsOnClose(t *testing.T) {
	clk := throttletest.NewClock()
	l, err := tokenbucket.New(throttle.PerSecond(10), 2, throttle.WithClock(clk), throttle.WithSweepInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Allow(t.Context(), "a", 1)
	if l.Len() != 1 {
		t.Fatalf("Len = %d", l.Len())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(t.Context(), "a", 1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("Allow after Close: %v", err)
	}
	if _, err := l.Reserve(t.Context(), "a", 1, 0); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("Reserve after Close: %v", err)
	}
	if err := l.Debit("a", 1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("Debit after Close: %v", err)
	}
}

// AllowQuota serves keys of different tiers from one limiter; a key keeps
// what it used when its limit changes, and a decision allocates nothing.
func TestAllowQuota(t *testing.T) {
	clk := throttletest.NewClock()
	l, err := tokenbucket.New(throttle.PerSecond(1), 1, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	free, pro := throttle.PerSecond(1), throttle.PerSecond(100)
	admitted := func(key string, r throttle.Rate, burst int) (n int) {
		for range 1000 {
			d, err := l.AllowQuota(t.Context(), key, 1, r, burst)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return n
			}
			n++
		}
		return n
	}
	if n := admitted("f", free, 5); n != 5 {
		t.Fatalf("free tier admitted %d at once, want 5", n)
	}
	if n := admitted("p", pro, 50); n != 50 {
		t.Fatalf("pro tier admitted %d at once, want 50", n)
	}
	// Upgraded to pro after using up its 5: the used 5 s of debt read at
	// 100/s are 500 tokens' worth, more than a 50 burst: still denied now.
	if n := admitted("f", pro, 50); n != 0 {
		t.Fatalf("after the upgrade %d admitted at once, want 0", n)
	}
	clk.Advance(5 * time.Second)
	if n := admitted("f", pro, 50); n != 50 {
		t.Fatalf("5 s after the upgrade %d admitted, want 50", n)
	}
	for _, c := range []struct {
		n     int
		r     throttle.Rate
		burst int
		want  error
	}{{1, throttle.Rate{}, 5, throttle.ErrInvalid}, {1, free, 0, throttle.ErrInvalid}, {6, free, 5, throttle.ErrExceedsLimit}, {0, free, 5, throttle.ErrInvalid}} {
		if _, err := l.AllowQuota(t.Context(), "k", c.n, c.r, c.burst); !errors.Is(err, c.want) {
			t.Errorf("AllowQuota(n=%d, %v, %d) = %v, want %v", c.n, c.r, c.burst, err, c.want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = l.AllowQuota(t.Context(), "p", 1, pro, 50) }); a != 0 {
		t.Fatalf("%v allocs per AllowQuota", a)
	}
}

// A fresh bucket is full at any instant a clock can return, before 1970
// too (an empty state once meant "full at 1970": a clock in 1960 denied a
// new key for 10 years).
func TestBucketsBefore1970(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1960, 6, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Unix(0, 0),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		clk := throttletest.NewClock()
		clk.Set(at)
		l, err := tokenbucket.New(throttle.PerSecond(1), 3, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		b, err := tokenbucket.NewBucket(throttle.PerSecond(1), 3, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		for _, lim := range []throttle.Limiter{l, b} {
			if got := l.Tokens("fresh"); got != 3 {
				t.Errorf("%v: a fresh key has %d tokens, want 3", at, got)
			}
			for i := range 3 {
				if d, err := lim.Allow(t.Context(), "k", 1); err != nil || !d.Allowed {
					t.Fatalf("%v: call %d on a fresh bucket: %+v, %v", at, i, d, err)
				}
			}
			if d, _ := lim.Allow(t.Context(), "k", 1); d.Allowed || d.RetryAfter != time.Second {
				t.Fatalf("%v: fourth call %+v, want denied for 1s", at, d)
			}
		}
		l.Close()
	}
}
