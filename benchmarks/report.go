package benchmarks

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Table is a Markdown table.
type Table struct {
	Head []string
	Rows [][]string
	// Left is how many leading columns are left-aligned (0 means 2);
	// the others are right-aligned.
	Left int
}

// Write writes t as GitHub Markdown; columns after the first are right-aligned.
func (t Table) Write(w io.Writer) error {
	var b strings.Builder
	row := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	row(t.Head)
	b.WriteString("|")
	left := t.Left
	if left == 0 {
		left = 2
	}
	for i := range t.Head {
		if i < left {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		row(r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// label is a subject's name as shown in tables: ours in bold, wall-clock
// runs marked.
func label(s Subject) string {
	if s.Ours {
		return "**" + s.Name + "**"
	}
	return s.Name
}

// subjectsOf returns the subjects appearing in res, in registry order.
func subjectsOf[T any](res []T, subject func(T) Subject) []Subject {
	var out []Subject
	for _, s := range Subjects() {
		for _, r := range res {
			if subject(r).Name == s.Name {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func workloadsOf(res []SpeedResult) []Workload {
	var out []Workload
	for _, r := range res {
		if !slices.ContainsFunc(out, func(w Workload) bool { return w.Slug == r.Workload.Slug }) {
			out = append(out, r.Workload)
		}
	}
	return out
}

// find returns s's result on w.
func find(res []SpeedResult, s Subject, w Workload) (SpeedResult, bool) {
	return first(res, func(r SpeedResult) bool { return r.Subject.Name == s.Name && r.Workload.Slug == w.Slug })
}

// first returns the first of res that match accepts.
func first[T any](res []T, match func(T) bool) (T, bool) {
	if i := slices.IndexFunc(res, match); i >= 0 {
		return res[i], true
	}
	var none T
	return none, false
}

// tableHead is the head of a table of subjects with a column per name.
func tableHead(names []string) []string {
	return append([]string{"limiter", "algorithm"}, names...)
}

// SpeedTables returns the ns/op table and the B/op, allocs/op table.
// A cell whose calls missed the intended path more than 1% of the time is
// marked with †.
func SpeedTables(res []SpeedResult) (ns, mem Table) {
	ws := workloadsOf(res)
	var names []string
	for _, w := range ws {
		names = append(names, w.Name)
	}
	ns.Head, mem.Head = tableHead(names), tableHead(names)
	for _, s := range subjectsOf(res, func(r SpeedResult) Subject { return r.Subject }) {
		a := []string{label(s), s.Algo}
		b := []string{label(s), s.Algo}
		for _, w := range ws {
			r, ok := find(res, s, w)
			if !ok {
				a, b = append(a, "—"), append(b, "—")
				continue
			}
			m := r.Median()
			cell := fmt.Sprintf("%.1f", m.NsPerOp)
			if m.MissPerOp > 0.01 {
				cell += " †"
			}
			a = append(a, cell)
			b = append(b, fmt.Sprintf("%.0f B, %.0f", m.BytesPerOp, m.AllocsPerOp))
		}
		ns.Rows = append(ns.Rows, a)
		mem.Rows = append(mem.Rows, b)
	}
	return ns, mem
}

// GuardTable shows the guard's ratios.
func GuardTable(g []GuardResult, maxRatio float64) Table {
	t := Table{Head: []string{"ours", "workload", "ours ns/op", "x/time/rate ns/op", "ratio (median of rounds)", "ratio of fastest samples", "rounds slower (sign test p)", fmt.Sprintf("either ≤ %.2f, or p ≥ 0.05", maxRatio)}}
	for _, r := range g {
		ok := "ok"
		if r.Fail {
			ok = "**FAIL**"
		}
		t.Rows = append(t.Rows, []string{r.Subject, r.Workload, fmt.Sprintf("%.1f", r.Ours), fmt.Sprintf("%.1f", r.Peer), fmt.Sprintf("%.2f", r.Ratio), fmt.Sprintf("%.2f", r.MinRatio), fmt.Sprintf("%d of %d (%.3f)", r.Slower, r.Rounds, r.P), ok})
	}
	return t
}

func traceNames(res []AccuracyResult) []string {
	var out []string
	for _, r := range res {
		if !slices.Contains(out, r.Trace) {
			out = append(out, r.Trace)
		}
	}
	return out
}

// findAcc returns s's result on trace.
func findAcc(res []AccuracyResult, s Subject, trace string) (AccuracyResult, bool) {
	return first(res, func(r AccuracyResult) bool { return r.Subject.Name == s.Name && r.Trace == trace })
}

// AccuracyTables returns admitted/ideal per trace, and the most admitted
// in any window over the limit per trace plus the recovery time.
func AccuracyTables(res []AccuracyResult) (ratio, window Table) {
	traces := traceNames(res)
	ratio.Head = tableHead(traces)
	window.Head = append(tableHead(traces), "recovery (windows)")
	for _, s := range subjectsOf(res, func(r AccuracyResult) Subject { return r.Subject }) {
		name := label(s)
		if !s.VirtualTime {
			name += " ⏱"
		}
		a := []string{name, s.Algo}
		b := []string{name, s.Algo}
		rec := "—"
		for _, t := range traces {
			r, ok := findAcc(res, s, t)
			if !ok {
				a, b = append(a, "—"), append(b, "—")
				continue
			}
			cell := fmt.Sprintf("%.3f", r.Ratio())
			if r.Errors > 0 {
				cell += fmt.Sprintf(" (%d errors)", r.Errors)
			}
			a = append(a, cell)
			b = append(b, fmt.Sprintf("%.2f", r.WindowRatio()))
			if !math.IsNaN(r.Recovery) {
				if r.Recovery < 0 {
					rec = "never"
				} else {
					rec = fmt.Sprintf("%.3f", r.Recovery)
				}
			}
		}
		b = append(b, rec)
		ratio.Rows = append(ratio.Rows, a)
		window.Rows = append(window.Rows, b)
	}
	return ratio, window
}

// ContentionTable shows the wall-clock contention check.
func ContentionTable(res []ContentionResult) Table {
	t := Table{Head: []string{"limiter", "algorithm", "calls", "admitted", "ideal", "admitted/ideal", "max in a window / limit", "errors"}}
	for _, r := range res {
		t.Rows = append(t.Rows, []string{
			label(r.Subject), r.Subject.Algo, fmt.Sprint(r.Calls), fmt.Sprint(r.Admitted),
			fmt.Sprintf("%.0f", r.Ideal), fmt.Sprintf("%.3f", r.Ratio()),
			fmt.Sprintf("%.2f", float64(r.MaxInWindow)/float64(r.Limit)), fmt.Sprint(r.Errors),
		})
	}
	return t
}

// NotesTable lists where each subject's semantics differ.
func NotesTable(subjects []Subject) Table {
	t := Table{Head: []string{"limiter", "algorithm", "clock", "n > 1", "note"}, Left: 5}
	for _, s := range subjects {
		clock := "virtual"
		if !s.VirtualTime {
			clock = "wall ⏱"
		}
		weighted := "yes"
		if !s.Weighted {
			weighted = "no"
		}
		note := s.Note
		if note == "" {
			note = "—"
		}
		t.Rows = append(t.Rows, []string{label(s), s.Algo, clock, weighted, note})
	}
	return t
}
