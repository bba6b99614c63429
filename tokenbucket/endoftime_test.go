package tokenbucket_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

// TestEndOfTime: near 2262, the end of int64 nanoseconds, a bucket whose
// state would pass it refuses with an error wrapping ErrInvalid instead of
// wrapping around and admitting everything (it admitted 1000 of 1000).
func TestEndOfTime(t *testing.T) {
	year := 366 * 24 * time.Hour
	for _, c := range []struct {
		rate  throttle.Rate
		burst int
		at    time.Time
		want  int // admitted at one instant before refusals
	}{
		{throttle.NewRate(1, year), 36, time.Date(2250, 1, 1, 0, 0, 0, 0, time.UTC), 12},
		{throttle.PerSecond(1), 10, time.Unix(0, math.MaxInt64-int64(5*time.Second)), 5},
		{throttle.PerSecond(1), 10, time.Unix(0, math.MaxInt64), 0},
		{throttle.PerSecond(1), 10, time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), 10},
	} {
		clk := throttletest.NewClock()
		clk.Set(c.at)
		b, err := tokenbucket.NewBucket(c.rate, c.burst, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		l, err := tokenbucket.New(c.rate, c.burst, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		for name, lim := range map[string]throttle.Limiter{"Bucket": b, "Limiter": l} {
			admitted, refused := 0, 0
			for range 1000 {
				d, err := lim.Allow(t.Context(), "k", 1)
				switch {
				case errors.Is(err, throttle.ErrInvalid):
					refused++
				case err != nil:
					t.Fatalf("%s at %v: %v", name, c.at, err)
				case d.Allowed:
					admitted++
				}
			}
			if admitted != c.want || admitted+refused != 1000 && c.want < c.burst {
				t.Errorf("%s %v burst %d at %v: admitted %d, refused %d; want %d admitted, the rest refused", name, c.rate, c.burst, c.at, admitted, refused, c.want)
			}
		}
	}
}

// TestDebitEndOfTime: a debit near 2262 saturates at the end of time
// instead of wrapping (which skipped the debit and left the bucket full).
func TestDebitEndOfTime(t *testing.T) {
	clk := throttletest.NewClock()
	clk.Set(time.Unix(0, math.MaxInt64-int64(time.Hour)))
	b, err := tokenbucket.NewBucket(throttle.PerSecond(1), 10, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Debit(1 << 40); err != nil {
		t.Fatal(err)
	}
	if tok := b.Tokens(); tok > -3000 {
		t.Errorf("Tokens after a huge debit an hour before the end = %d, want about -3590", tok)
	}
	if d, err := b.AllowN(1); d.Allowed || !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("AllowN after the debit = %+v, %v; want a refusal wrapping ErrInvalid", d, err)
	}
}
