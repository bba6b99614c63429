package rules_test

import (
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/throttletest"
)

// TestCarryAllocs: while a rebuilt window limit carries usage over, a
// decision on a key already carried allocates nothing (a key's first
// decision in that span records it, once).
func TestCarryAllocs(t *testing.T) {
	clk := throttletest.NewClock()
	c1, _ := rules.Parse([]byte(`{"default": {"limit": 1000000, "window": "1h"}}`))
	c2, _ := rules.Parse([]byte(`{"default": {"limit": 1000000, "window": "2h"}}`))
	l, err := rules.New(c1, rules.WithLimiterOptions(throttle.WithClock(clk)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(ctx, "k", 1)
	if err := l.Update(c2); err != nil {
		t.Fatal(err)
	}
	l.Allow(ctx, "k", 1)
	if n := testing.AllocsPerRun(100, func() { l.Allow(ctx, "k", 1) }); n != 0 {
		t.Errorf("a decision while usage is carried over: %v allocs", n)
	}
}
