package rules

import (
	"slices"
	"strings"
)

// infix indexes the literal runs of patterns that begin and end with a
// wildcard ("*abc*", "?ab*cd*"): an Aho–Corasick automaton over one
// literal run of each (its longest), which every key the pattern matches
// contains. One pass over a key finds the runs it contains; only the
// patterns filed under those are tried. The automaton is flat slices
// (the edges of a state sorted by byte), built once by seal; a scan does
// not allocate. The zero infix holds no runs.
type infix struct {
	// Per state: its edges are edges[first[s]:first[s+1]].
	first []int32
	edges []infixEdge
	fail  []int32 // the longest proper suffix that is a state
	out   []int32 // the run ending at the state, or -1
	dict  []int32 // the nearest state on the fail chain with a run, or -1
}

type infixEdge struct {
	c  byte
	to int32
}

// longestRun returns the longest run of literal bytes of pattern (the
// first of the longest), "" if it has none.
func longestRun(pattern string) string {
	best := ""
	for _, run := range strings.FieldsFunc(pattern, func(r rune) bool { return r == '*' || r == '?' }) {
		if len(run) > len(best) {
			best = run
		}
	}
	return best
}

// buildInfix returns the automaton of runs; run i is reported as i.
func buildInfix(runs []string) infix {
	children := []map[byte]int32{{}}
	out := []int32{-1}
	for id, run := range runs {
		s := int32(0)
		for i := 0; i < len(run); i++ {
			nx, ok := children[s][run[i]]
			if !ok {
				nx = int32(len(children))
				children = append(children, map[byte]int32{})
				out = append(out, -1)
				children[s][run[i]] = nx
			}
			s = nx
		}
		out[s] = int32(id)
	}
	a := infix{first: make([]int32, len(children)+1), fail: make([]int32, len(children)),
		out: out, dict: make([]int32, len(children))}
	for s, ch := range children {
		a.first[s] = int32(len(a.edges))
		for c, to := range ch {
			a.edges = append(a.edges, infixEdge{c, to})
		}
		slices.SortFunc(a.edges[a.first[s]:], func(x, y infixEdge) int { return int(x.c) - int(y.c) })
	}
	a.first[len(children)] = int32(len(a.edges))
	a.links()
	return a
}

// links sets the fail and dict links, breadth first from the root.
func (a *infix) links() {
	a.dict[0] = -1
	queue := []int32{0}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, e := range a.edges[a.first[s]:a.first[s+1]] {
			f := int32(0)
			if s != 0 {
				f = a.step(a.fail[s], e.c)
			}
			a.fail[e.to] = f
			if a.out[f] >= 0 {
				a.dict[e.to] = f
			} else {
				a.dict[e.to] = a.dict[f]
			}
			queue = append(queue, e.to)
		}
	}
}

// edge returns the state s goes to on c, or -1.
func (a *infix) edge(s int32, c byte) int32 {
	es := a.edges[a.first[s]:a.first[s+1]]
	if i, ok := slices.BinarySearchFunc(es, c, func(e infixEdge, c byte) int { return int(e.c) - int(c) }); ok {
		return es[i].to
	}
	return -1
}

// step returns the state after s reads c.
func (a *infix) step(s int32, c byte) int32 {
	for {
		if to := a.edge(s, c); to >= 0 {
			return to
		}
		if s == 0 {
			return 0
		}
		s = a.fail[s]
	}
}
