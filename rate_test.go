package throttle_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
)

func TestRateConstructors(t *testing.T) {
	cases := []struct {
		name     string
		r        throttle.Rate
		count    int64
		per      time.Duration
		interval time.Duration
	}{
		{"PerSecond(100)", throttle.PerSecond(100), 1, 10 * time.Millisecond, 10 * time.Millisecond},
		{"PerSecond(3)", throttle.PerSecond(3), 3, time.Second, 333333334},
		{"NewRate(5, time.Minute)", throttle.NewRate(5, time.Minute), 1, 12 * time.Second, 12 * time.Second},
		{"NewRate(7200, time.Hour)", throttle.NewRate(7200, time.Hour), 1, 500 * time.Millisecond, 500 * time.Millisecond},
		{"NewRate(1, 6s)", throttle.NewRate(1, 6*time.Second), 1, 6 * time.Second, 6 * time.Second},
		{"1e9/s", throttle.PerSecond(1e9), 1, 1, 1},
		{"1/day", throttle.NewRate(1, 24*time.Hour), 1, 24 * time.Hour, 24 * time.Hour},
		{"NewRate(10, 10s)", throttle.NewRate(10, 10*time.Second), 1, time.Second, time.Second},
	}
	for _, c := range cases {
		if err := c.r.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", c.name, err)
		}
		if c.r.Count() != c.count || c.r.Period() != c.per || c.r.Duration(1) != c.interval {
			t.Errorf("%s = %d/%v interval %v, want %d/%v interval %v", c.name,
				c.r.Count(), c.r.Period(), c.r.Duration(1), c.count, c.per, c.interval)
		}
	}
}

// TestRateExact checks the integer arithmetic where float64 drifts: the
// time to earn n events and the events earned in d are exact for any n.
func TestRateExact(t *testing.T) {
	r := throttle.PerSecond(3)
	for n := int64(1); n <= 3000; n++ {
		d := r.Duration(n)
		if got := r.Events(d); got != n {
			t.Fatalf("Events(Duration(%d)=%v) = %d", n, d, got)
		}
		if got := r.Events(d - 1); got != n-1 {
			t.Fatalf("Events(Duration(%d)-1ns) = %d, want %d", n, got, n-1)
		}
	}
	if got := r.Duration(3 * 1e9); got != 1e9*time.Second {
		t.Fatalf("3e9 events at 3/s take %v, want exactly 1e9 s", got)
	}
	if got := throttle.NewRate(1, time.Hour).Duration(math.MaxInt64); got != math.MaxInt64 {
		t.Fatalf("Duration saturates at %v, want MaxInt64", got)
	}
	if got := throttle.PerSecond(1e9).Events(math.MaxInt64); got != math.MaxInt64 {
		t.Fatalf("Events(MaxInt64) at 1e9/s = %d, want MaxInt64", got)
	}
	// 1190112520884487201·31/2 is 2^64 - 1/2: rounded up, 2^64, which
	// must saturate, not wrap to 0.
	if got := throttle.NewRate(2, 31).Duration(1190112520884487201); got != math.MaxInt64 {
		t.Fatalf("Duration of a quotient rounding up to 2^64 = %v, want MaxInt64", got)
	}
}

func TestRateInvalid(t *testing.T) {
	bad := map[string]throttle.Rate{
		"zero value":   {},
		"zero count":   throttle.PerSecond(0),
		"negative":     throttle.PerSecond(-5),
		"zero period":  throttle.NewRate(1, 0),
		"neg period":   throttle.NewRate(1, -time.Second),
		"above 1e9/s":  throttle.PerSecond(1e9 + 1),
		"below 1/year": throttle.NewRate(1, 400*24*time.Hour),
	}
	for name, r := range bad {
		if err := r.Validate(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
		if r.Duration(1) < 0 || r.Events(time.Second) < 0 {
			t.Errorf("%s: negative Duration/Events", name)
		}
	}
}

func TestParseRate(t *testing.T) {
	good := map[string]throttle.Rate{
		"100/s":      throttle.PerSecond(100),
		"5/1m":       throttle.NewRate(5, time.Minute),
		"1/6s":       throttle.NewRate(1, 6*time.Second),
		" 10 / min ": throttle.NewRate(10, time.Minute),
		"86400/day":  throttle.PerSecond(1),
		"2/2d":       throttle.NewRate(1, 24*time.Hour),
		"3/hour":     throttle.NewRate(3, time.Hour),
		"1/250ms":    throttle.PerSecond(4),
	}
	for in, want := range good {
		got, err := throttle.ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := throttle.ParseRate(got.String()); err != nil || back != got {
			t.Errorf("ParseRate(%q.String()=%q) = %v, %v", in, got.String(), back, err)
		}
	}
	for _, in := range []string{"", "100", "/s", "x/s", "0/s", "-1/s", "1/0s", "1/-1s", "1/fortnight",
		"2000000000/s", "1/400d", "1/0d", "99999999999999999999/s", "1.5/s"} {
		if _, err := throttle.ParseRate(in); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("ParseRate(%q) err = %v, want ErrInvalid", in, err)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100/s", "5/1m", "1/6s", "7/3d", "1/1ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := throttle.ParseRate(s)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("ParseRate(%q) error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if r.Validate() != nil || r.Duration(1) <= 0 {
			t.Fatalf("ParseRate(%q) = %v: accepted an invalid rate", s, r)
		}
	})
}

func TestRateString(t *testing.T) {
	for _, c := range []struct {
		r    throttle.Rate
		want string
	}{
		{throttle.PerSecond(100), "100/s"},
		{throttle.NewRate(5, time.Minute), "5/m"},
		{throttle.NewRate(1000, time.Hour), "1000/h"},
		{throttle.NewRate(86401, 24*time.Hour), "86401/d"},
		{throttle.NewRate(1, 6*time.Second), "10/m"},
		{throttle.NewRate(1, 7*time.Second), "1/7s"},
		{throttle.NewRate(3, 7*time.Millisecond), "3/7ms"},
		{throttle.PerSecond(1), "1/s"},
		{throttle.NewRate(1, 48*time.Hour), "1/48h0m0s"},
	} {
		if got := c.r.String(); got != c.want {
			t.Errorf("%v/%v: String() = %q, want %q", c.r.Count(), c.r.Period(), got, c.want)
		}
	}
}

// Every valid rate prints a text that ParseRate reads back as the same rate.
func TestRateStringRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		r := throttle.NewRate(int(rng.Int64N(1_000_000))+1, time.Duration(rng.Int64N(int64(bridge.MaxPeriod)))+1)
		if r.Validate() != nil {
			continue
		}
		back, err := throttle.ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("%d/%v prints %q, read back as %v (%v)", r.Count(), r.Period(), r, back, err)
		}
	}
}

func FuzzRateString(f *testing.F) {
	f.Add(int64(100), int64(time.Second))
	f.Add(int64(3), int64(7*time.Millisecond))
	f.Fuzz(func(t *testing.T, count, per int64) {
		if count <= 0 || count > 1<<31 || per <= 0 {
			return
		}
		r := throttle.NewRate(int(count), time.Duration(per))
		if r.Validate() != nil {
			return
		}
		back, err := throttle.ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("%d/%v prints %q, read back as %v (%v)", r.Count(), r.Period(), r, back, err)
		}
	})
}
