package rules

import (
	"math/rand/v2"
	"testing"
)

// TestSetMatchesLinearScan checks the indexed lookup against the rule it
// implements, scanned linearly: an exact key, else the most literal prefix
// or pattern (a prefix on a tie, then the one added first).
func TestSetMatchesLinearScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(alphabet string, n int) string {
		b := make([]byte, 1+r.IntN(n))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for round := range 300 {
		var s set[int]
		var ms []matcher
		seen := map[matcher]bool{}
		for range 1 + r.IntN(30) {
			m := matcher{kind: kind(r.IntN(3)), s: word("ab*?", 6)}
			if m.kind != kindPattern {
				m.s = word("ab", 5)
			}
			if seen[m] {
				continue
			}
			seen[m] = true
			s.add(m, len(ms))
			ms = append(ms, m)
		}
		s.seal()
		for range 50 {
			key := word("abc", 7)
			want, wantOK := -1, false
			var bestLit, bestRank int // rank: 2 exact, 1 prefix, 0 pattern
			for i, m := range ms {
				var hit bool
				rank := 0
				switch m.kind {
				case kindExact:
					hit, rank = key == m.s, 2
				case kindPrefix:
					hit, rank = len(key) >= len(m.s) && key[:len(m.s)] == m.s, 1
				case kindPattern:
					hit = Glob(m.s, key)
				}
				lit := m.literals()
				if rank == 2 {
					lit = 1 << 30
				}
				if hit && (!wantOK || lit > bestLit || lit == bestLit && rank > bestRank) {
					want, wantOK, bestLit, bestRank = i, true, lit, rank
				}
			}
			got, ok := s.lookup(key)
			if ok != wantOK || ok && got != want {
				t.Fatalf("round %d, key %q in %v: got %d %v, want %d %v", round, key, ms, got, ok, want, wantOK)
			}
		}
	}
}
