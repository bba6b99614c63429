package benchmarks

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestSummaryFits: the terminal summary of a full run (every subject,
// every workload and trace) fits 40 lines of 100 columns, and states each
// subject's ratio.
func TestSummaryFits(t *testing.T) {
	var speed []SpeedResult
	for _, w := range ThoroughWorkloads {
		for i, s := range Subjects() {
			if w.Supports(s) {
				speed = append(speed, SpeedResult{Subject: s, Workload: w, Samples: []Sample{{NsPerOp: float64(50 + i)}}})
			}
		}
	}
	var acc []AccuracyResult
	for _, s := range Subjects() {
		acc = append(acc, AccuracyResult{Subject: s, Trace: "steady", Limit: 100, Admitted: 99, Ideal: 100, MaxInWindow: 150})
	}
	var b bytes.Buffer
	if err := Summary(&b, speed, acc, map[string]float64{Allow.Slug: 10, Keys100k.Slug: 20}, map[string]float64{"tokenbucket.Limiter": 97.5}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines)+6 > 40 { // the caller adds a title and the paths written
		t.Errorf("%d lines, want at most 34", len(lines))
	}
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("%d columns: %q", n, l)
		}
	}
	out := b.String()
	for _, want := range []string{"* tokenbucket.Bucket", "x/time/rate ", "0.99", "1.50", "10.0 ns", " 98 "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	t.Log("\n" + out)
}
