package rules_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/throttlekit/throttle/rules"
)

// infixDoc has n deny patterns "*scraper-<i>-*", wildcards at both ends,
// and a rule "*-eu-*".
func infixDoc(n int) string {
	var b strings.Builder
	b.WriteString(`{"default": {"rate": "1000000/s", "burst": 1000000}, "rules": [`)
	b.WriteString(`{"pattern": "*-eu-*", "rate": "1000000/s", "burst": 1000000}], "deny": {"patterns": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"*scraper-%d-*"`, i)
	}
	b.WriteString(`]}}`)
	return b.String()
}

var infixKeys = []string{"nobody", "x-scraper-9999-y", "tenant-42-eu-prod-with-a-longer-key"}

// BenchmarkInfixPatterns decides keys against 10,000 deny patterns with a
// wildcard at both ends.
func BenchmarkInfixPatterns(b *testing.B) {
	l, _ := newLimiter(b, infixDoc(10000))
	for _, key := range infixKeys {
		b.Run(key, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l.Allow(ctx, key, 1)
			}
		})
	}
}

// TestPatternIndexMatchesGlob: for random patterns over a small alphabet
// (wildcards anywhere, at both ends included) and random keys, Lookup
// finds the pattern a linear scan with Glob finds: the most literal bytes,
// then the first listed.
func TestPatternIndexMatchesGlob(t *testing.T) {
	rng := uint64(7)
	next := func(n int) int { rng = rng*6364136223846793005 + 1442695040888963407; return int(rng>>33) % n }
	word := func(alpha string, max int) string {
		var b strings.Builder
		for range 1 + next(max) {
			b.WriteByte(alpha[next(len(alpha))])
		}
		return b.String()
	}
	for round := range 20 {
		seen := map[string]bool{}
		var pats []string
		for len(pats) < 200 {
			p := word("ab-*?", 7)
			if !seen[p] && strings.ContainsAny(p, "*?") {
				seen[p] = true
				pats = append(pats, p)
			}
		}
		var b strings.Builder
		b.WriteString(`{"default": {"rate": "1/s", "burst": 1}, "rules": [`)
		for i, p := range pats {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"pattern": %q, "rate": "1/s", "burst": 1}`, p)
		}
		b.WriteString(`]}`)
		c, err := rules.Parse([]byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		l, err := rules.New(c)
		if err != nil {
			t.Fatal(err)
		}
		for range 300 {
			key := word("ab-", 12)
			want, lit := "", -1
			for _, p := range pats {
				n := len(p) - strings.Count(p, "*") - strings.Count(p, "?")
				if n > lit && rules.Glob(p, key) {
					want, lit = p, n
				}
			}
			m, err := l.Lookup(key)
			if err != nil {
				t.Fatal(err)
			}
			if m.Pattern != want {
				t.Fatalf("round %d: key %q decided by %q, want %q", round, key, m.Pattern, want)
			}
		}
		l.Close()
	}
}
