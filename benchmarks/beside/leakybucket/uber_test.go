package leakybucket_test

import (
	"testing"
	"time"

	"go.uber.org/ratelimit"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

// uberClock is a virtual clock for go.uber.org/ratelimit: Sleep moves it.
type uberClock struct{ c *throttletest.Clock }

func (u uberClock) Now() time.Time        { return u.c.Now() }
func (u uberClock) Sleep(d time.Duration) { u.c.Advance(d) }

// TestPacerMatchesUber drives go.uber.org/ratelimit and a Pacer with the
// same slack through the same arrival times and checks that they grant
// exactly the same slots. Uber's limiter starts with no catch-up
// (a fresh Pacer counts as idle), so both are first used once and left
// idle.
func TestPacerMatchesUber(t *testing.T) {
	for _, slack := range []int{0, 1, 10} {
		uclk, pclk := throttletest.NewClock(), throttletest.NewClock()
		u := ratelimit.New(100, ratelimit.WithClock(uberClock{uclk}), ratelimit.WithSlack(slack))
		p, err := leakybucket.NewPacer(throttle.PerSecond(100), slack, leakybucket.Unbounded, throttle.WithClock(pclk))
		if err != nil {
			t.Fatal(err)
		}
		u.Take()
		if _, err := p.Reserve(); err != nil {
			t.Fatal(err)
		}
		uclk.Advance(time.Hour)
		pclk.Advance(time.Hour)
		// Arrivals: bursts, steady over-rate, under-rate and idle gaps.
		gaps := []time.Duration{0, 0, 0, 0, 0, 3 * time.Millisecond, 7 * time.Millisecond, 25 * time.Millisecond, 0, 0,
			100 * time.Millisecond, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15 * time.Millisecond, 2 * time.Second, 0, 0, 1}
		for rep := range 5 {
			for i, g := range gaps {
				g += time.Duration(rep) * time.Millisecond
				uclk.Advance(g)
				pclk.Advance(g)
				if !uclk.Now().Equal(pclk.Now()) {
					t.Fatalf("clocks diverged: %v vs %v", uclk.Now(), pclk.Now())
				}
				d, err := p.Reserve()
				if err != nil {
					t.Fatal(err)
				}
				slot := pclk.Now().Add(d)
				uslot := u.Take() // sleeps on uclk
				if !slot.Equal(uslot) {
					t.Fatalf("slack %d, arrival %d.%d: pacer slot %v, uber %v", slack, rep, i, slot.Sub(throttletest.Epoch), uslot.Sub(throttletest.Epoch))
				}
				pclk.Set(slot) // the caller acts at its slot, like uber's
			}
		}
	}
}
