package capacity

import (
	"testing"
	"time"
)

func TestClients(t *testing.T) {
	s, clk := newTestServer(t, testConfig(100))
	clk.Advance(time.Minute) // past learning
	ask(t, s, "b", ResourceRequest{Resource: "r", Wants: 30, Priority: 2, Weight: 3})
	ask(t, s, "a", ResourceRequest{Resource: "r", Wants: 10})
	ask(t, s, "c", ResourceRequest{Resource: "r", Wants: 5})
	got, n := s.Clients("r", 2)
	if n != 3 || len(got) != 2 || got[0].Client != "a" || got[1].Client != "b" {
		t.Fatalf("Clients = %+v, %d", got, n)
	}
	if b := got[1]; b.Wants != 30 || b.Priority != 2 || b.Weight != 3 || b.Held != 30 || b.Expires != 20*time.Second {
		t.Fatalf("client b: %+v", b)
	}
	if a := got[0]; a.Weight != 1 || a.Held != 10 {
		t.Fatalf("client a: %+v", a)
	}
	clk.Advance(21 * time.Second)
	if got, n := s.Clients("r", 0); n != 0 || len(got) != 0 {
		t.Fatalf("after expiry: %+v, %d", got, n)
	}
	if got, n := s.Clients("nope", 0); n != 0 || got != nil {
		t.Fatalf("unknown resource: %+v, %d", got, n)
	}
}
