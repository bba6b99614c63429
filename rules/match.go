package rules

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/throttlekit/throttle/limiterkit"
)

// MaxPatternLen bounds the length of a key, prefix or pattern in a rules
// document, in bytes.
const MaxPatternLen = limiterkit.DefaultMaxKeyLen

type kind uint8

const (
	kindExact kind = iota
	kindPrefix
	kindPattern
)

var kindNames = [...]string{"key", "prefix", "pattern"}

// matcher is one key, prefix or glob pattern of a document.
type matcher struct {
	kind kind
	s    string
}

func (m matcher) String() string { return kindNames[m.kind] + " " + quote(m.s) }

func (m matcher) validate(where string) error {
	switch {
	case m.s == "":
		return invalid("%s: empty %s", where, kindNames[m.kind])
	case len(m.s) > MaxPatternLen:
		return invalid("%s: %s of %d bytes is longer than %d", where, kindNames[m.kind], len(m.s), MaxPatternLen)
	case !utf8.ValidString(m.s):
		return invalid("%s: %s %q is not valid UTF-8", where, kindNames[m.kind], m.s)
	}
	return nil
}

// literals is the number of bytes of m that must appear in a matching key:
// the measure of how specific a prefix or a pattern is.
func (m matcher) literals() int {
	if m.kind != kindPattern {
		return len(m.s)
	}
	return len(m.s) - strings.Count(m.s, "*") - strings.Count(m.s, "?")
}

// Glob reports whether key matches pattern, in which '*' stands for any
// run of characters (none included) and '?' for exactly one UTF-8
// character; every other byte stands for itself. There is no escape: a
// literal '*' or '?' in a key is matched by '?'. Glob does not allocate
// and runs in O(len(pattern)·len(key)) at worst.
func Glob(pattern, key string) bool {
	px, kx := 0, 0
	starPx, starKx := -1, 0 // where to resume after the last '*'
	for px < len(pattern) || kx < len(key) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starPx, starKx = px, kx
				px++
				continue
			case '?':
				if kx < len(key) {
					_, w := utf8.DecodeRuneInString(key[kx:])
					px, kx = px+1, kx+w
					continue
				}
			default:
				if kx < len(key) && key[kx] == c {
					px, kx = px+1, kx+1
					continue
				}
			}
		}
		// Mismatch: let the last '*' take one more character, if any.
		if starPx >= 0 && starKx < len(key) {
			_, w := utf8.DecodeRuneInString(key[starKx:])
			starKx += w
			px, kx = starPx+1, starKx
			continue
		}
		return false
	}
	return true
}

// set finds the most specific of a group of matchers for a key: an exact
// key wins, then the prefix or pattern with the most literal bytes (a
// prefix before a pattern of the same count, then the one listed first).
// A lookup does not allocate.
type set[T any] struct {
	exact    map[string]T
	prefixes map[string]T
	plens    []int // distinct prefix lengths, longest first
	patterns []pattern[T]
}

type pattern[T any] struct {
	s   string
	lit int
	v   T
}

func (s *set[T]) add(m matcher, v T) {
	switch m.kind {
	case kindExact:
		if s.exact == nil {
			s.exact = map[string]T{}
		}
		s.exact[m.s] = v
	case kindPrefix:
		if s.prefixes == nil {
			s.prefixes = map[string]T{}
		}
		s.prefixes[m.s] = v
		if !slices.Contains(s.plens, len(m.s)) {
			s.plens = append(s.plens, len(m.s))
			slices.SortFunc(s.plens, func(a, b int) int { return b - a })
		}
	case kindPattern:
		s.patterns = append(s.patterns, pattern[T]{s: m.s, lit: m.literals(), v: v})
		slices.SortStableFunc(s.patterns, func(a, b pattern[T]) int { return b.lit - a.lit })
	}
}

func (s *set[T]) empty() bool {
	return len(s.exact) == 0 && len(s.prefixes) == 0 && len(s.patterns) == 0
}

func (s *set[T]) lookup(key string) (v T, ok bool) {
	if v, ok = s.exact[key]; ok {
		return v, true
	}
	best := -1
	for _, n := range s.plens {
		if n <= len(key) {
			if v, ok = s.prefixes[key[:n]]; ok {
				best = n
				break
			}
		}
	}
	for i := range s.patterns {
		p := &s.patterns[i]
		if p.lit <= best {
			break
		}
		if Glob(p.s, key) {
			return p.v, true
		}
	}
	return v, best >= 0
}

func sortStrings(s []string) { slices.Sort(s) }

var _ fmt.Stringer = matcher{}
