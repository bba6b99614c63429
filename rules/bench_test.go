package rules_test

import (
	"fmt"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/throttletest"
)

// benchDoc has 1000 exact keys, 100 prefixes of 10 lengths and 20
// patterns, plus allow and deny lists.
func benchDoc() string {
	s := `{"default": {"rate": "1000000/s", "burst": 1000000}, "rules": [`
	for i := 0; i < 1000; i++ {
		s += fmt.Sprintf(`{"key": "user-%d", "rate": "1000000/s", "burst": 1000000},`, i)
	}
	for i := 0; i < 100; i++ {
		s += fmt.Sprintf(`{"prefix": "%s%d:", "rate": "1000000/s", "burst": 1000000},`, "pppppppppp"[:i%10+1], i)
	}
	for i := 0; i < 20; i++ {
		s += fmt.Sprintf(`{"pattern": "svc-%d-*-prod", "rate": "1000000/s", "burst": 1000000},`, i)
	}
	s = s[:len(s)-1] + `], "allow": {"keys": ["health"], "prefixes": ["ops:"]}, "deny": {"keys": ["bad"], "patterns": ["bot-*"]}}`
	return s
}

func BenchmarkAllow(b *testing.B) {
	c, err := rules.Parse([]byte(benchDoc()))
	if err != nil {
		b.Fatal(err)
	}
	clk := throttletest.NewClock()
	l, err := rules.New(c, rules.WithLimiterOptions(throttle.WithClock(clk)))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for name, key := range map[string]string{
		"exact":   "user-500",
		"prefix":  "ppppp44:abc",
		"default": "nobody-matches-this",
		"allow":   "ops:deploy",
		"deny":    "bad",
		"pattern": "svc-7-eu-prod",
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.Allow(ctx, key, 1)
				}
			})
		})
	}
}

// TestAllocs pins the 0 allocs of the decision path for exact keys,
// prefixes, the default and both lists.
func TestAllocs(t *testing.T) {
	c, _ := rules.Parse([]byte(benchDoc()))
	l, err := rules.New(c, rules.WithLimiterOptions(throttle.WithClock(throttletest.NewClock())))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, key := range []string{"user-500", "ppppp44:abc", "nobody", "ops:deploy", "bad", "svc-7-eu-prod"} {
		l.Allow(ctx, key, 1)
		if n := testing.AllocsPerRun(100, func() { l.Allow(ctx, key, 1) }); n != 0 {
			t.Errorf("Allow(%q): %v allocs", key, n)
		}
	}
}
