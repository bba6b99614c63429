package daemon

import (
	"math/rand/v2"
	"testing"
)

// oldestIdle returns exactly the connection idle longest, when it is idle
// past the cutoff, whatever the activity since the list was last put in
// order; and the list stays in order.
func TestOldestIdle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		l := connList{k: 1}
		var cs []*conn
		now := int64(0)
		for range r.IntN(50) + 1 {
			now += r.Int64N(10)
			c := &conn{}
			c.last.Store(now)
			c.links[1].seen = now
			l.insert(c)
			cs = append(cs, c)
		}
		for step := range 100 {
			now += r.Int64N(10)
			// Some connections read something.
			for _, c := range cs {
				if r.IntN(4) == 0 {
					c.last.Store(max(c.last.Load(), now-r.Int64N(5))) // only forward, as reads come
				}
			}
			cutoff := now - r.Int64N(200)
			var want *conn
			for _, c := range cs {
				if c.last.Load() <= cutoff && (want == nil || c.last.Load() < want.last.Load()) {
					want = c
				}
			}
			got := l.oldestIdle(cutoff)
			if got != want && (got == nil || want == nil || got.last.Load() != want.last.Load()) {
				t.Fatalf("round %d step %d: oldestIdle(%d) = %v, want %v", round, step, cutoff, got, want)
			}
			n, prev := 0, int64(-1)
			for c := l.head; c != nil; c = c.links[1].next {
				if s := c.links[1].seen; s < prev || s > c.last.Load() {
					t.Fatalf("list out of order: seen %d after %d (last %d)", s, prev, c.last.Load())
				}
				prev = c.links[1].seen
				n++
			}
			if n != l.n || n != len(cs) {
				t.Fatalf("list holds %d, n %d, want %d", n, l.n, len(cs))
			}
			if got != nil && r.IntN(3) == 0 {
				l.remove(got)
				for i, c := range cs {
					if c == got {
						cs = append(cs[:i], cs[i+1:]...)
						break
					}
				}
				if len(cs) == 0 {
					break
				}
			}
		}
	}
}
