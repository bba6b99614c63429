package leakybucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

// TestPacerEndOfTime: a Pacer at one slot per 366 days in 2200 hands out
// ever later slots until the next would pass 2262, then refuses with an
// error wrapping ErrInvalid (it used to hand out delay 0 after delays of
// 544,608 h).
func TestPacerEndOfTime(t *testing.T) {
	year := 366 * 24 * time.Hour
	clk := throttletest.NewClock()
	clk.Set(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC))
	p, err := leakybucket.NewPacer(throttle.Every(year), 0, leakybucket.Unbounded, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	last, slots := time.Duration(-1), 0
	for range 100 {
		d, err := p.Reserve()
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("after %d slots: %v, want an error wrapping ErrInvalid", slots, err)
			}
			break
		}
		if d <= last {
			t.Fatalf("slot %d: delay %v after %v", slots, d, last)
		}
		last, slots = d, slots+1
	}
	if slots != 62 {
		t.Errorf("%d slots before the end of time, want 62", slots)
	}
}
