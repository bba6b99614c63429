package tokenbucket

import (
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
	for _, c := range []struct{ max, others int }{{10, 50}, {1024, 1500}} {
		clk := throttletest.NewClock()
		l, err := New(throttle.PerHour(1), 1, throttle.WithClock(clk), throttle.WithMaxKeys(c.max))
		if err != nil {
			t.Fatal(err)
		}
		if n := throttletest.Readmissions(l, 1, c.others, 10); n != 0 {
			t.Errorf("MaxKeys %d: evicted key readmitted in %d of 10 rounds", c.max, n)
		}
		clk.Advance(time.Hour)
		if denied := throttletest.FalseDenials(l, "after", 1, c.max); denied != 0 {
			t.Errorf("MaxKeys %d: %d new keys denied after the horizon", c.max, denied)
		}
		l.Close()
	}
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
				l, err := New(throttle.PerHour(burst), burst, throttle.WithClock(clk), throttle.WithMaxKeys(maxKeys))
				if err != nil {
					t.Fatal(err)
				}
				flood := k * maxKeys
				denied := throttletest.FalseDenials(l, fmt.Sprint("f", k), max(1, burst/10), flood)
				t.Logf("burst %d, MaxKeys %d, flood of %d new keys taking %d unit(s): %d denied (%.1f%%)", burst, maxKeys, flood, max(1, burst/10), denied, 100*float64(denied)/float64(flood))
				if burst == 10 && denied != 0 {
					t.Errorf("a flood taking 1 of 10 units denied %d new keys", denied)
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
