package rules_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/throttlekit/throttle/rules"
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
	l, _ := newLimiter(b, benchDoc())
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
// prefixes, patterns (indexed by head and by tail), the default and both
// lists.
func TestAllocs(t *testing.T) {
	for doc, keys := range map[string][]string{
		benchDoc():            {"user-500", "ppppp44:abc", "nobody", "ops:deploy", "bad", "svc-7-eu-prod"},
		patternDoc(1000, 100): {"nobody", "tenant-50-eu-prod", "scraper-999-x"},
		infixDoc(1000):        infixKeys,
		`{"default": {"rate": "1/s", "burst": 1}, "rules": [{"pattern": "*-eu", "rate": "1000000/s", "burst": 1000000}, {"pattern": "*mid*", "rate": "1000000/s", "burst": 1000000}]}`: {"a-eu", "xmidx"},
	} {
		l, _ := newLimiter(t, doc)
		for _, key := range keys {
			l.Allow(ctx, key, 1)
			if n := testing.AllocsPerRun(100, func() { l.Allow(ctx, key, 1) }); n != 0 {
				t.Errorf("Allow(%q): %v allocs", key, n)
			}
		}
	}
}

// patternDoc has n deny patterns "scraper-<i>-*" and rules rules by
// pattern.
func patternDoc(n, rules int) string {
	var b strings.Builder
	b.WriteString(`{"default": {"rate": "1000000/s", "burst": 1000000}, "rules": [`)
	for i := range rules {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"pattern": "tenant-%d-*-prod", "rate": "1000000/s", "burst": 1000000}`, i)
	}
	if rules == 0 {
		b.WriteString(`{"key": "k", "rate": "1/s", "burst": 1}`)
	}
	b.WriteString(`], "deny": {"patterns": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"scraper-%d-*"`, i)
	}
	b.WriteString(`]}}`)
	return b.String()
}

// BenchmarkPatterns decides keys against 10,000 deny patterns and 1,000
// pattern rules.
func BenchmarkPatterns(b *testing.B) {
	l, _ := newLimiter(b, patternDoc(10000, 1000))
	for _, key := range []string{"nobody", "tenant-500-eu-prod", "scraper-9999-x"} {
		b.Run(key, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(ctx, key, 1)
			}
		})
	}
}

// BenchmarkBuildPatterns builds the rules of 20,000 deny patterns.
func BenchmarkBuildPatterns(b *testing.B) {
	c, err := rules.Parse([]byte(patternDoc(20000, 0)))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		l, err := rules.New(c)
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
	}
}
