package capacity

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestFaultGaugeUnitsInFlight: A holds 10 units of a gauge of capacity 10
// when B asks for 10; A's lease drops to 5, but the semaphore does not
// take held units back. A reports what it holds, max(lease, units held),
// so the server counts A's 10 until A has released units: sampled every
// 10ms while B takes every unit its lease allows, the units held add up
// to at most 10, and B gets its 5 once A is down to its lease.
func TestFaultGaugeUnitsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Resources: []Template{{ID: "*", Capacity: 10, LeaseLength: 10 * time.Second, RefreshInterval: 2 * time.Second}}}
		s, err := NewServer(cfg, WithSeed(1))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // past learning
		n := new(Network)
		n.Attach("s1", s)
		gauge := func(id string) *GaugeResource {
			c := dialClient(t, n, []string{"s1"}, WithClientID(id), WithMode(Pessimistic), WithMinRefreshGap(0))
			g, err := c.Gauge("r", 10)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		a := gauge("a")
		time.Sleep(time.Second)
		var releases []func()
		for range 10 {
			d, release, err := a.TryHold(t.Context(), "", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("a's unit %d of its lease of 10: %+v, %v", len(releases)+1, d, err)
			}
			releases = append(releases, release)
		}
		b := gauge("b")
		worst := 0
		sample := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
				for {
					if d, release, _ := b.TryHold(t.Context(), "", 1); !d.Allowed {
						break
					} else {
						releases = append(releases, release) // b keeps them
					}
				}
				if sum := a.InFlight() + b.InFlight(); sum > worst {
					worst = sum
					if sum > 10 {
						t.Errorf("t=%v: units held %d (a %d, b %d) > 10", time.Now(), sum, a.InFlight(), b.InFlight())
					}
				}
			}
		}
		sample(40 * time.Second) // several of a's old leases expire
		for _, release := range releases[:5] {
			release() // a is down to its share
		}
		sample(10 * time.Second)
		if got := b.InFlight(); got != 5 {
			t.Errorf("b holds %d units once a released 5, want 5", got)
		}
		t.Logf("worst units held %d of 10", worst)
	})
}
