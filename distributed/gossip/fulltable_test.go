package gossip

import (
	"math"
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
// at most one bucket per key in the long run, within 5%, and so does
// every key: a node decides the keys it has no room for under
// OverflowKey, and charges its peers' reports of them to the overflow
// bucket. Before, it dropped those reports: a key that some nodes held
// and others decided under the overflow key got the overflow bucket's
// admissions on top of its own bucket (1.27 of it with one key more than
// the tables hold, 1.15 with ten).
func TestFullTablesLongRun(t *testing.T) {
	for _, keys := range []int{101, 110, 300} {
		all, worst, ov := fullTables(t, keys, 100, 3, 60*time.Second)
		t.Logf("%d keys, tables of 100: admitted %.4f of one bucket per key, worst key %.4f, %d decisions and reports under the overflow key", keys, all, worst, ov)
		if all > 1.05 {
			t.Errorf("%d keys: admitted %.4f of one bucket per key, want at most 1.05", keys, all)
		}
		if worst > 1.05 {
			t.Errorf("%d keys: a key admitted %.4f of its bucket, want at most 1.05", keys, worst)
		}
	}
}

// TestUntrackedReportsAreCapped: forged reports of 1,000 keys a full
// table has no room for, each of 2^63-1 hits, take the overflow bucket
// no lower than what the reports of every member could take a full
// bucket to, however many keys they name; a report seen again charges
// only its growth.
func TestUntrackedReportsAreCapped(t *testing.T) {
	c := newCluster(t, 2, throttle.PerSecond(10), 20, time.Second, false, 1)
	c.nodes[1].settings.MaxKeys = 1
	l, err := c.nodes[1].NewLimiter("full", throttle.PerSecond(10), 20)
	if err != nil {
		t.Fatal(err)
	}
	l.Allow(ctx, "held", 1)
	c.runTo(c.clk.Now().Add(3 * time.Second))
	now := c.clk.Now()
	send := func(keys int, hits uint64) {
		n0 := c.nodes[0]
		b := n0.encode(msgReport, "full", now.UnixNano()/int64(time.Second), func(e *encoder) {
			for k := range keys {
				e.addReport(reportEntry{key: "k" + strconv.Itoa(k), born: now.UnixNano() - int64(time.Second), hits: hits, demand: hits})
			}
		})
		for _, p := range n0.sealFor("n1", b) {
			inject(c.nodes[1], "n0", p)
		}
	}
	send(1, 5)
	if tok := l.Tokens(OverflowKey); tok != 15 {
		t.Fatalf("a report of 5 hits of a key the table has no room for: overflow bucket at %d, want 15", tok)
	}
	c.clk.Advance(time.Millisecond)
	send(1, 5) // seen again: nothing new
	if tok := l.Tokens(OverflowKey); tok != 15 {
		t.Fatalf("the same report again: overflow bucket at %d, want 15", tok)
	}
	send(1000, math.MaxInt64)
	floor := -2 * l.allowance(0)
	if tok := l.Tokens(OverflowKey); tok < floor {
		t.Fatalf("forged reports took the overflow bucket to %d tokens, want at least %d", tok, floor)
	}
	if st := c.nodes[1].Stats(); st.Capped == 0 {
		t.Fatalf("stats %+v: want the excess counted in Capped", st)
	}
}
