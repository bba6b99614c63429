package tokenbucket_test

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

var fuzzRates = []throttle.Rate{
	throttle.PerSecond(10),
	throttle.PerSecond(3), // fractional interval
	throttle.NewRate(1, 6*time.Second),
	throttle.NewRate(2, 3), // 1.5 ns per unit, rounded to 2
	throttle.NewRate(int(bridge.MaxPerSecond), time.Second),
	throttle.NewRate(1, bridge.MaxPeriod),
	throttle.NewRate(7, time.Minute),
}

var fuzzSteps = []time.Duration{0, time.Nanosecond, time.Microsecond, time.Millisecond, 37 * time.Millisecond, time.Second, time.Hour}

// FuzzBound drives a Bucket and a keyed Limiter in lockstep through a
// sequence of (time step, operation, n) and checks that: they agree on
// every decision; the Decision fields are in range; and since the last
// SetRate/SetBurst, the admitted units never exceed burst + rate·elapsed.
func FuzzBound(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 0, 1, 3, 1, 2, 0, 0, 1})
	f.Add([]byte{4, 3, 200, 0, 5, 3, 5, 0, 2, 0, 4, 1, 6, 6, 9, 1, 3, 4})
	f.Add([]byte{5, 0, 4, 0, 6, 1, 3, 0, 255, 7, 2, 9, 1, 2, 3})
	f.Fuzz(fuzzOne)
}

func fuzzOne(t *testing.T, ops []byte) {
	clk := throttletest.NewClock()
	rate, burst := fuzzRates[0], 5
	b, err := tokenbucket.NewBucket(rate, burst, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	l, err := tokenbucket.New(rate, burst, throttle.WithClock(clk), throttle.WithMaxKeys(4))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seg := clk.Now()
	var admitted int64
	for ; len(ops) >= 3; ops = ops[3:] {
		op, a, c := ops[0], ops[1], int(ops[2])
		clk.Advance(time.Duration(a>>3) * fuzzSteps[int(a&7)%len(fuzzSteps)])
		switch op % 8 {
		case 0, 1, 2, 3:
			n := 1 + c%burst
			d, err := b.AllowN(n)
			e, err2 := l.Allow(t.Context(), "k", n)
			if err != nil || err2 != nil {
				t.Fatalf("AllowN(%d): %v / %v", n, err, err2)
			}
			if d != e {
				t.Fatalf("Bucket and Limiter disagree: %+v / %+v", d, e)
			}
			if d.Limit != burst || d.Remaining < 0 || d.Remaining > burst || d.ResetAfter < 0 ||
				(d.Allowed && d.RetryAfter != 0) || (!d.Allowed && d.RetryAfter <= 0) {
				t.Fatalf("AllowN(%d) = %+v: fields out of range", n, d)
			}
			if d.Allowed {
				admitted += int64(n)
			}
		case 4:
			if err := b.Debit(int64(c) + 1); err != nil {
				t.Fatal(err)
			}
			if err := l.Debit("k", int64(c)+1); err != nil {
				t.Fatal(err)
			}
		case 5:
			rate = fuzzRates[c%len(fuzzRates)]
			if err := b.SetRate(rate); err != nil {
				t.Fatal(err)
			}
			if err := l.SetRate(rate); err != nil {
				t.Fatal(err)
			}
			seg, admitted = clk.Now(), 0
		case 6:
			burst = 1 + c%16
			if err := b.SetBurst(burst); err != nil {
				t.Fatal(err)
			}
			if err := l.SetBurst(burst); err != nil {
				t.Fatal(err)
			}
			seg, admitted = clk.Now(), 0
		case 7: // book and cancel at once: never more generous than before
			r, err := b.ReserveN(1+c%burst, time.Duration(c)*time.Millisecond)
			s, err2 := l.Reserve(t.Context(), "k", 1+c%burst, time.Duration(c)*time.Millisecond)
			if err != nil || err2 != nil || r.OK != s.OK || r.Delay != s.Delay {
				t.Fatalf("Reserve: %+v %v / %+v %v", r, err, s, err2)
			}
			r.Cancel()
			s.Cancel()
		}
		if tb, tl := b.Tokens(), l.Tokens("k"); tb != tl || tb > int64(burst) {
			t.Fatalf("Tokens: Bucket %d, Limiter %d, burst %d", tb, tl, burst)
		}
		elapsed := clk.Now().Sub(seg)
		if bound := int64(burst) + rate.Events(elapsed); admitted > bound {
			t.Fatalf("admitted %d in %v at %v burst %d: above the bound %d", admitted, elapsed, rate, burst, bound)
		}
	}
}
