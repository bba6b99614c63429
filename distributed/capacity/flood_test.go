package capacity

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// TestFaultFloodOfIDs: while three clients share "r", a flood of 20,000
// made-up client ids, each asking for 10 of 50 made-up resources, and one
// id asking for 999 resources of its own, meet the server's bounds: every
// request beyond them is refused with ErrExhausted, the tables stay
// within their bounds and the heap grows by a few MB at most, and the
// three clients keep their leases throughout (Σ enforced, sampled every
// 10ms, stays their shares). Once the flood's leases expire, newcomers
// get in again.
func TestFaultFloodOfIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxLeases, perClient, maxResources, maxClients = 2000, 20, 100, 1000
		g := newRig(t, issueConfig(), 100)
		s, _ := g.server("s1", g.cfg, nil, WithMaxLeases(maxLeases, perClient), WithMaxResources(maxResources), WithMaxClients(maxClients))
		time.Sleep(10 * time.Second) // past learning
		for _, id := range []string{"a", "b", "c"} {
			g.client(id, []string{"s1"}, 30)
		}
		g.run("three clients", 5*time.Second)
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		refused := 0
		flood := func(client string, first, n int) {
			req := &Request{Client: client}
			for j := first; j < first+n; j++ {
				req.Resources = append(req.Resources, ResourceRequest{Resource: fmt.Sprintf("made-up-%d", j), Wants: 1})
			}
			resp, err := s.GetCapacity(t.Context(), req)
			switch {
			case errors.Is(err, ErrExhausted):
				refused++
			case err != nil:
				t.Fatalf("%s: %v, want ErrExhausted", client, err)
			default:
				for _, gr := range resp.Grants {
					if gr.Err != nil && !errors.Is(gr.Err, ErrExhausted) {
						t.Fatalf("%s: %v, want ErrExhausted", client, gr.Err)
					}
				}
			}
		}
		flood("greedy", 1000, maxRequestResources-1)
		for i := range 20_000 {
			flood(fmt.Sprintf("flood%05d", i), i%5*10, 10)
			if i%1000 == 0 {
				g.run("flood", 10*time.Millisecond)
			}
		}
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		st := s.Status()
		s.leases.mu.Lock()
		total, greedy := s.leases.total, s.leases.perClient["greedy"]
		s.leases.mu.Unlock()
		t.Logf("refused %d of 20,001 requests; %d resources, %d leases; heap grew %d kB", refused, len(st.Resources), total, grown>>10)
		switch {
		case len(st.Resources) > maxResources || total > maxLeases || greedy > perClient:
			t.Errorf("tables past their bounds: %d resources, %d leases, greedy holds %d", len(st.Resources), total, greedy)
		case refused == 0:
			t.Error("no request was refused")
		case grown > 8<<20:
			t.Errorf("heap grew %d kB", grown>>10)
		}
		g.run("after the flood", 10*time.Second)
		g.settled(30, 30, 30)
		time.Sleep(issueConfig().Resources[0].LeaseLength + 2*dropInterval) // the flood's leases expire
		if resp, err := s.GetCapacity(t.Context(), &Request{Client: "late", Resources: []ResourceRequest{{Resource: "new", Wants: 1}}}); err != nil || resp.Grants[0].Err != nil {
			t.Errorf("a newcomer after the flood: %+v, %v", resp, err)
		}
		g.report()
	})
}
