package gossip

import (
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
)

// TestMemoryPerKeyInCluster measures (go test -v) the heap a key holds on
// each node of a 3-node cluster when every node admits it: its entry and
// the records of the two peers' counters. The 1M-key goal is 300 bytes.
func TestMemoryPerKeyInCluster(t *testing.T) {
	if race {
		t.Skip("slow under the race detector, which does not change sizes")
	}
	const keys = 20_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	perKey := limitertest.HeapPer(3*keys, func() any {
		c := newCluster(t, 3, throttle.NewRate(1, time.Hour), 10, time.Second, false, 1)
		for _, l := range c.lims {
			for _, k := range names {
				l.Allow(ctx, k, 1)
			}
		}
		for range 5 {
			c.runTo(c.clk.Now().Add(time.Second))
		}
		for _, n := range c.nodes {
			if got := n.Stats().HitsApplied; got != 2*keys {
				t.Fatalf("a node charged %d hits, want %d", got, 2*keys)
			}
		}
		return c
	})
	t.Logf("%.0f B of heap per key and node (3 nodes, every key admitted on each)", perKey)
	if perKey > 540 {
		t.Errorf("%.0f B per key and node, above the 540 the documentation allows (it states about 490)", perKey)
	}
}
