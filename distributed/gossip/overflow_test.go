package gossip

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// With the gossip table full, a new key is still limited and still
// shared: it is charged to the limit's overflow key, whose hits every
// peer debits.
func TestTableFullKeysStayLimitedAndShared(t *testing.T) {
	c := newCluster(t, 2, throttle.NewRate(1, time.Hour), 5, time.Second, false, 1, func(*Config) {})
	// The cluster's nodes with room for 4 keys each.
	for i := range c.nodes {
		c.nodes[i].settings.MaxKeys = 4
		l, err := c.nodes[i].NewLimiter("small", throttle.NewRate(1, time.Hour), 5)
		if err != nil {
			t.Fatal(err)
		}
		c.lims[i] = l
	}
	for k := range 4 {
		c.lims[0].Allow(ctx, fmt.Sprintf("junk-%d", k), 1)
	}
	admitted := 0
	for range 20 {
		if d, _ := c.lims[0].Allow(ctx, "victim", 1); d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("node 0, table full: victim admitted %d of 20, want 5 (the overflow bucket)", admitted)
	}
	if tok := c.lims[0].Tokens("victim"); tok != 0 {
		t.Fatalf("Tokens of a key the full table has no room for: %d, want the overflow bucket's 0", tok)
	}
	c.runTo(c.clk.Now().Add(3 * time.Second))
	if st := c.nodes[1].Stats(); st.HitsApplied < 9 {
		t.Fatalf("peer applied %d hits, want the 4 junk hits and the 5 overflow hits (stats %+v)", st.HitsApplied, st)
	}
	if tok := c.lims[1].Tokens(OverflowKey); tok != 0 {
		t.Fatalf("peer's overflow bucket holds %d tokens, want 0", tok)
	}
	if st := c.nodes[0].Stats(); st.Overflow != 20 {
		t.Fatalf("Overflow %d, want 20", st.Overflow)
	}
}
