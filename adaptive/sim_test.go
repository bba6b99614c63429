package adaptive_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/adaptive/adaptivesim"
	"github.com/throttlekit/throttle/throttletest"
)

// TestSimulation runs every subject of adaptivesim at 0.5×, 1× and 3×
// load on the simulated backend and prints the tables of docs/adaptive.md
// (go test -run TestSimulation -v ./adaptive). It asserts the goals
// (adaptivesim's Result.Goals) for every adaptive limiter: goodput ≥ 95%
// of capacity at 1× and 3× load and, at 3× load, back to 95% within 10 s
// of the capacity's recovery, the p99 of admitted requests ≤ 2× the
// unloaded p99, and back under that bound within 5 s of the halving.
func TestSimulation(t *testing.T) {
	loads, subjects := []float64{0.5, 1, 3}, adaptivesim.Subjects()
	if adaptive.RaceOn { // the race detector makes the whole table take a minute: check the goals at 3× only
		loads = []float64{3}
		subjects = slices.DeleteFunc(subjects, func(s adaptivesim.Subject) bool { return s.Fixed })
	}
	var rows, curves []adaptivesim.Row
	for _, s := range subjects {
		for _, load := range loads {
			clk := throttletest.NewClock()
			r := adaptivesim.Run(s.New(clk), load, 1, adaptivesim.OnClock(clk))
			rows = append(rows, adaptivesim.Row{Name: s.Name, Load: load, Result: r})
			if load == 3 {
				curves = append(curves, rows[len(rows)-1])
			}
			if s.Fixed {
				continue
			}
			for _, m := range r.Goals(load) {
				t.Errorf("%s at %.1f×: %s", s.Name, load, m)
			}
		}
	}
	var b strings.Builder
	adaptivesim.WriteTable(&b, rows)
	b.WriteString("\nAt 3× load, every 10 s: limit / p99 (ms) / served per second\n\n")
	adaptivesim.WriteCurves(&b, curves)
	t.Log("\n" + b.String())
}
