package adaptive_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/adaptive"
	"github.com/throttlekit/throttle/internal/adaptivesim"
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

// TestShapes runs Vegas, Gradient2 and AIMD, at their defaults, at 1× and
// 3× load on every backend of adaptivesim.Shapes and prints the table of
// docs/adaptive.md (go test -run TestShapes -v ./adaptive). The goals are
// goodput ≥ 95% of capacity at 1× and 3×, and p99 ≤ 2× the backend's
// unloaded p99 at 3×; a miss not listed in knownMisses fails.
func TestShapes(t *testing.T) {
	if adaptive.RaceOn {
		t.Skip("the race detector makes the runs take minutes")
	}
	subjects := []struct {
		name string
		alg  func() adaptive.Algorithm
	}{
		{"Vegas", func() adaptive.Algorithm { return &adaptive.Vegas{} }},
		{"Gradient2", func() adaptive.Algorithm { return &adaptive.Gradient2{} }},
		{"AIMD", func() adaptive.Algorithm { return &adaptive.AIMD{} }},
	}
	var rows []adaptivesim.ShapeRow
	for i, b := range adaptivesim.Shapes() {
		unloaded := b.Unloaded()
		for _, s := range subjects {
			for _, load := range []float64{1, 3} {
				clk := throttletest.NewClock()
				l, err := adaptive.New(s.alg(), adaptive.Config{}, throttle.WithClock(clk))
				if err != nil {
					t.Fatal(err)
				}
				r := adaptivesim.RunOn(b, adaptivesim.LimiterGate{L: l}, load, 1, adaptivesim.OnClock(clk), unloaded)
				miss := r.ShapeGoals(load, unloaded)
				rows = append(rows, adaptivesim.ShapeRow{Shape: b.Name, Unloaded: unloaded,
					Row: adaptivesim.Row{Name: s.name, Load: load, Result: r}, Miss: miss})
				if len(miss) > 0 && !knownMisses[fmt.Sprintf("%d %s %.0f", i, s.name, load)] {
					t.Errorf("%s, %s at %.0f×: %v", b.Name, s.name, load, miss)
				}
			}
		}
	}
	var out strings.Builder
	adaptivesim.WriteShapes(&out, rows)
	t.Log("\n" + out.String())
}

// knownMisses are the runs of TestShapes (shape index, limiter, load)
// that miss a goal, as docs/adaptive.md states.
var knownMisses = map[string]bool{
	"0 Vegas 3": true, "0 AIMD 3": true, // 4 servers: p99
	"3 Vegas 1": true,                                                                  // bimodal: goodput 94.7%
	"4 AIMD 3":  true,                                                                  // slow start: p99
	"6 Vegas 1": true, "6 Vegas 3": true, "6 Gradient2 1": true, "6 Gradient2 3": true, // latency rising without a queue: goodput
}
