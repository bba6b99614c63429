package fixedwindow

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestEvictedKeyNotFresh: a key evicted by the MaxKeys cap while its
// window is full must not come back with an empty window, aligned or
// anchored; and nobody is held once the window has passed.
func TestEvictedKeyNotFresh(t *testing.T) {
	for _, anchored := range []bool{false, true} {
		for _, c := range []struct{ max, others int }{{10, 50}, {1024, 1500}} {
			clk := throttletest.NewClock()
			l, err := newLimiter(1, time.Hour, anchored, []throttle.Option{throttle.WithClock(clk), throttle.WithMaxKeys(c.max)})
			if err != nil {
				t.Fatal(err)
			}
			if n := throttletest.Readmissions(l, 1, c.others, 10); n != 0 {
				t.Errorf("anchored=%v MaxKeys %d: evicted key readmitted in %d of 10 rounds", anchored, c.max, n)
			}
			clk.Advance(time.Hour)
			if denied := throttletest.FalseDenials(l, "after", 1, c.max); denied != 0 {
				t.Errorf("anchored=%v MaxKeys %d: %d new keys denied after the horizon", anchored, c.max, denied)
			}
			l.Close()
		}
	}
}
