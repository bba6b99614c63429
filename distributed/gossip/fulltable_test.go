package gossip

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// fullTables asks keys keys, each at over times its rate, of 3 nodes
// whose tables hold maxKeys keys each, every ask on a node picked at
// random, for d; each node first meets the keys in an order of its own,
// so that their full tables hold different keys. It returns what the
// cluster admitted over what one bucket per key admits, in all and for
// the worst key.
func fullTables(t *testing.T, keys, maxKeys int, over float64, d time.Duration) (all, worst float64, overflow uint64) {
	rate, burst := throttle.PerSecond(1), 2
	c := newCluster(t, 3, rate, burst, time.Second, false, 1)
	for i := range c.nodes {
		c.nodes[i].settings.MaxKeys = maxKeys
		l, err := c.nodes[i].NewLimiter("full", rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		c.lims[i] = l
	}
	rng := rand.New(rand.NewPCG(7, 11))
	key := func(k int) string { return "k" + strconv.Itoa(k) }
	for _, l := range c.lims {
		for _, k := range rng.Perm(keys) {
			l.Allow(ctx, key(k), 1)
		}
	}
	start := c.clk.Now()
	perKey := make([]int64, keys)
	gap := time.Duration(float64(time.Second) / over)
	for at := start; at.Before(start.Add(d)); at = at.Add(gap) {
		c.runTo(at)
		for k := range keys {
			if dd, _ := c.lims[rng.IntN(3)].Allow(ctx, key(k), 1); dd.Allowed {
				perKey[k]++
			}
		}
	}
	ideal := float64(int64(burst) + rate.Events(d))
	var sum int64
	for _, n := range perKey {
		sum += n
		worst = max(worst, float64(n)/ideal)
	}
	for _, n := range c.nodes {
		overflow += n.Stats().Overflow
	}
	return float64(sum) / (ideal * float64(keys)), worst, overflow
}

// TestFullTablesLongRun: at more keys than the nodes' tables hold
// (WithMaxKeys), each node holding keys of its own, the cluster admits
// at most one bucket per key plus one overflow bucket in all, at most
// (K+1)/K of one bucket per key: a node decides the keys it has no room
// for under OverflowKey, whose bucket every node charges, and does not
// charge its peers' reports of them (it has no counter to take their
// growth from). A key that some nodes hold and others decide under the
// overflow key can get the overflow bucket's admissions on top of its
// own bucket: at most 2 buckets, 1.27 measured with one key over the
// tables' room.
func TestFullTablesLongRun(t *testing.T) {
	for _, keys := range []int{101, 110, 300} {
		all, worst, ov := fullTables(t, keys, 100, 3, 60*time.Second)
		t.Logf("%d keys, tables of 100: admitted %.4f of one bucket per key, worst key %.4f, %d decisions and reports under the overflow key", keys, all, worst, ov)
		if bound := float64(keys+1) / float64(keys); all > bound || all > 1.05 {
			t.Errorf("%d keys: admitted %.4f of one bucket per key, want at most %.4f", keys, all, bound)
		}
		if worst > 2 {
			t.Errorf("%d keys: a key admitted %.4f of its bucket, want at most 2 (its bucket and the overflow bucket)", keys, worst)
		}
	}
}
