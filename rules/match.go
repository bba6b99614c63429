package rules

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/throttlekit/throttle/internal/limiterkit"
)

// maxPatternLen bounds the length of a key, prefix or pattern in a rules
// document, in bytes.
const maxPatternLen = limiterkit.DefaultMaxKeyLen

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
	case len(m.s) > maxPatternLen:
		return invalid("%s: %s of %d bytes is longer than %d", where, kindNames[m.kind], len(m.s), maxPatternLen)
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

// glob reports whether key matches pattern, in which '*' stands for any
// run of characters (none included) and '?' for exactly one UTF-8
// character; every other byte stands for itself. There is no escape: a
// literal '*' or '?' in a key is matched by '?'. glob does not allocate
// and runs in O(len(pattern)·len(key)) at worst.
func glob(pattern, key string) bool {
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
//
// Patterns are indexed by their literal affix: the longer of the literal
// bytes before the first wildcard and after the last (the head on a tie),
// in a map per side, with the distinct affix lengths listed, as prefixes
// are. A lookup asks each map for the key's head or tail of each length,
// then tries with glob only the patterns filed under it, most literal
// first, and stops at the first that matches or cannot beat the best so
// far. Patterns that begin and end with a wildcard ("*abc*") are filed
// under their longest literal run, which a matching key contains: one
// pass of an Aho–Corasick automaton over the key (see infix) finds the
// runs it contains, and only their patterns are tried. Patterns with no
// literal byte at all ("*", "?*?") are tried in a list of their own.
// Adding is O(1); seal sorts and builds once.
type set[T any] struct {
	exact    map[string]T
	prefixes map[string]T
	plens    []int // distinct prefix lengths, longest first

	heads, tails map[string][]pattern[T] // patterns by literal head or tail
	hlens, tlens []int                   // distinct head and tail lengths
	runs         map[string]int32        // the literal runs of the others, by id
	byRun        [][]pattern[T]          // their patterns, by run id
	infix        infix                   // the automaton of the runs
	rest         []pattern[T]            // patterns without a literal byte
	n            int                     // patterns added
}

type pattern[T any] struct {
	s   string
	lit int // literal bytes
	ord int // order added
	v   T
}

// better reports whether p is more specific than q: more literal bytes,
// else listed first.
func (p *pattern[T]) better(q *pattern[T]) bool {
	return q == nil || p.lit > q.lit || p.lit == q.lit && p.ord < q.ord
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
		}
	case kindPattern:
		p := pattern[T]{s: m.s, lit: m.literals(), ord: s.n, v: v}
		s.n++
		head := strings.IndexAny(m.s, "*?")
		tail := len(m.s) - 1 - strings.LastIndexAny(m.s, "*?")
		switch {
		case head < 0: // no wildcard: matches itself only
			s.heads, s.hlens = file(s.heads, s.hlens, m.s, p)
		case head > 0 && head >= tail:
			s.heads, s.hlens = file(s.heads, s.hlens, m.s[:head], p)
		case tail > 0:
			s.tails, s.tlens = file(s.tails, s.tlens, m.s[len(m.s)-tail:], p)
		default:
			s.fileRun(p)
		}
	}
}

// fileRun files p, which begins and ends with a wildcard, under its
// longest literal run.
func (s *set[T]) fileRun(p pattern[T]) {
	run := longestRun(p.s)
	if run == "" {
		s.rest = append(s.rest, p)
		return
	}
	if s.runs == nil {
		s.runs = map[string]int32{}
	}
	id, ok := s.runs[run]
	if !ok {
		id = int32(len(s.byRun))
		s.runs[run] = id
		s.byRun = append(s.byRun, nil)
	}
	s.byRun[id] = append(s.byRun[id], p)
}

// file adds p under affix to m, noting a new length in lens.
func file[T any](m map[string][]pattern[T], lens []int, affix string, p pattern[T]) (map[string][]pattern[T], []int) {
	if m == nil {
		m = map[string][]pattern[T]{}
	}
	if _, ok := m[affix]; !ok && !slices.Contains(lens, len(affix)) {
		lens = append(lens, len(affix))
	}
	m[affix] = append(m[affix], p)
	return m, lens
}

// seal orders what add collected; it must be called before lookup.
func (s *set[T]) seal() {
	slices.SortFunc(s.plens, func(a, b int) int { return b - a })
	order := func(a, b pattern[T]) int {
		if a.lit != b.lit {
			return b.lit - a.lit
		}
		return a.ord - b.ord
	}
	for _, l := range s.heads {
		slices.SortFunc(l, order)
	}
	for _, l := range s.tails {
		slices.SortFunc(l, order)
	}
	slices.SortFunc(s.rest, order)
	for _, l := range s.byRun {
		slices.SortFunc(l, order)
	}
	if len(s.runs) > 0 {
		runs := make([]string, len(s.runs))
		for run, id := range s.runs {
			runs[id] = run
		}
		s.infix = buildInfix(runs)
	}
}

func (s *set[T]) empty() bool {
	return len(s.exact) == 0 && len(s.prefixes) == 0 && s.n == 0
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
	if s.n == 0 {
		return v, best >= 0
	}
	// A pattern must have more literal bytes than the prefix found.
	floor := pattern[T]{lit: best, ord: -1}
	win := &floor
	for _, n := range s.hlens {
		if n <= len(key) {
			win = try(s.heads[key[:n]], key, win)
		}
	}
	for _, n := range s.tlens {
		if n <= len(key) {
			win = try(s.tails[key[len(key)-n:]], key, win)
		}
	}
	if len(s.byRun) > 0 {
		win = s.tryRuns(key, win)
	}
	win = try(s.rest, key, win)
	if win != &floor {
		return win.v, true
	}
	return v, best >= 0
}

// tryRuns tries the patterns filed under the literal runs key contains,
// each run's once (the first 16 runs found are remembered; a run found
// again after those is tried again, which is only slower).
func (s *set[T]) tryRuns(key string, win *pattern[T]) *pattern[T] {
	var seen [16]int32
	ns := 0
	a := &s.infix
	st := int32(0)
	for i := 0; i < len(key); i++ {
		st = a.step(st, key[i])
		for o := st; o >= 0; o = a.dict[o] {
			id := a.out[o]
			if id < 0 || slices.Contains(seen[:ns], id) {
				continue
			}
			if ns < len(seen) {
				seen[ns] = id
				ns++
			}
			win = try(s.byRun[id], key, win)
		}
	}
	return win
}

// try returns the first pattern of list (most specific first) that
// matches key and is better than win, or win.
func try[T any](list []pattern[T], key string, win *pattern[T]) *pattern[T] {
	for i := range list {
		p := &list[i]
		if !p.better(win) {
			break
		}
		if glob(p.s, key) {
			return p
		}
	}
	return win
}

func sortStrings(s []string) { slices.Sort(s) }

var _ fmt.Stringer = matcher{}
