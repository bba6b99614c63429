package benchmarks

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Summary writes the terminal summary of a run: per subject, its speed as
// a ratio to x/time/rate's on the same workloads of the same run (one key
// allowed and denied, serial; many keys against x/time/rate in a sync.Map),
// and its accuracy on the worst trace: admitted over what an exact token
// bucket admits, and the most admitted in any window over the limit. It
// fits 100 columns and one line per subject, so the whole fits a screen.
//
// overhead holds, per workload slug, what the speed loop alone costs per
// call (see Overhead); it is subtracted from both sides of a ratio, so
// that a ratio compares what a user's call costs. Nil subtracts nothing.
//
// bytesPerKey holds, per keyed subject, the heap it holds per tracked key
// (see BytesPerKey); nil leaves the column out.
func Summary(w io.Writer, speed []SpeedResult, acc []AccuracyResult, overhead, bytesPerKey map[string]float64) error {
	fmt.Fprintln(w, "Speed: ns/op ÷ x/time/rate's in this run (lower is faster; 100k keys: ÷ x/time/rate in a")
	fmt.Fprintln(w, "sync.Map). Accuracy, worst trace: admitted ÷ an exact token bucket's (above 1 over-admits),")
	fmt.Fprintln(w, "and the most admitted in one window ÷ the limit. B/key: heap held per tracked key. * = ours.")
	if h1, hk := overhead[Allow.Slug], overhead[Keys100k.Slug]; h1 > 0 || hk > 0 {
		fmt.Fprintf(w, "The benchmark loop alone costs %.1f ns per call on one key, %.1f on 100k keys: taken out of\n", h1, hk)
		fmt.Fprintln(w, "both sides of every ratio, which compare what a call costs a user.")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-28s %7s %7s %9s %7s   %10s %10s\n", "limiter", "allow", "deny", "100k keys", "B/key", "adm/ideal", "max/limit")
	fmt.Fprintln(w, strings.Repeat("-", 86))
	cell := func(v float64, unit string) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "–"
		}
		return fmt.Sprintf("%.2f%s", v, unit)
	}
	for _, r := range summaryRows(speed, acc, overhead) {
		name := r.name
		if r.ours {
			name = "* " + name
		}
		if len(name) > 28 {
			name = name[:27] + "…"
		}
		mem := "–"
		if b, ok := bytesPerKey[r.name]; ok {
			mem = fmt.Sprintf("%.0f", b)
		}
		fmt.Fprintf(w, "%-28s %7s %7s %9s %7s   %10s %10s\n", name,
			cell(r.allow, "×"), cell(r.deny, "×"), cell(r.key, "×"), mem, cell(r.ideal, ""), cell(r.window, ""))
	}
	return nil
}

// summaryRow is a subject's line of Summary.
type summaryRow struct {
	name             string
	ours             bool
	allow, deny, key float64 // ratios; NaN when not measured
	ideal, window    float64 // worst over traces; NaN when none ran
}

// summaryRows are the lines of Summary, one per subject in the order they
// first appear in speed, then acc.
func summaryRows(speed []SpeedResult, acc []AccuracyResult, overhead map[string]float64) []summaryRow {
	ns := map[[2]string]float64{} // (subject, workload slug) → median ns/op
	var order []string
	ours := map[string]bool{}
	add := func(s Subject) {
		if _, seen := ours[s.Name]; !seen {
			order = append(order, s.Name)
		}
		ours[s.Name] = s.Ours
	}
	for _, r := range speed {
		ns[[2]string{r.Subject.Name, r.Workload.Slug}] = r.Median().NsPerOp
		add(r.Subject)
	}
	for _, a := range acc {
		add(a.Subject)
	}
	ratio := func(name, peer, slug string) float64 {
		o, ok1 := ns[[2]string{name, slug}]
		p, ok2 := ns[[2]string{peer, slug}]
		h := overhead[slug]
		if slug == Deny.Slug {
			h = overhead[Allow.Slug] // the same loop
		}
		if !ok1 || !ok2 || p-h <= 0 {
			return math.NaN()
		}
		return max(o-h, 0) / (p - h)
	}
	worst := worstAccuracy(acc)
	var rows []summaryRow
	for _, name := range order {
		r := summaryRow{name: name, ours: ours[name], ideal: math.NaN(), window: math.NaN(),
			allow: ratio(name, "x/time/rate", Allow.Slug), deny: ratio(name, "x/time/rate", Deny.Slug),
			key: ratio(name, "x/time/rate+sync.Map", Keys100k.Slug)}
		if wr, ok := worst[name]; ok && !math.IsInf(wr[0], -1) {
			r.ideal, r.window = wr[0], wr[1]
		}
		rows = append(rows, r)
	}
	return rows
}

// worstAccuracy is, per subject, the highest admitted ÷ ideal (-Inf when
// no trace had an ideal) and most in a window ÷ limit over its traces.
func worstAccuracy(acc []AccuracyResult) map[string][2]float64 {
	worst := map[string][2]float64{}
	for _, a := range acc {
		cur, ok := worst[a.Subject.Name]
		if !ok {
			cur = [2]float64{math.Inf(-1), math.Inf(-1)}
		}
		if r := a.Ratio(); !math.IsNaN(r) {
			cur[0] = max(cur[0], r)
		}
		cur[1] = max(cur[1], a.WindowRatio())
		worst[a.Subject.Name] = cur
	}
	return worst
}
