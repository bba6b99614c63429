package benchmarks

import (
	"flag"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/throttlekit/throttle/internal/adaptivesim"
	"github.com/throttlekit/throttle/throttletest"
)

var adaptiveDocs = flag.String("adaptive-docs", "", "TestAdaptiveSimulation: run every load and draw the charts into this directory")

// TestAdaptiveSimulation runs the adaptive simulation of aegis's BBR at 3×
// load, prints its result and draws its curves into a temporary
// directory. With -adaptive-docs DIR it runs every
// subject of AdaptiveSubjects, aegis's BBR beside this module's limiters,
// at 0.5×, 1× and 3× load, prints the tables of docs/adaptive.md and
// draws the curves at 3× load into DIR (see WriteAdaptiveCharts):
//
//	cd benchmarks && go test -run TestAdaptiveSimulation -v . -args -adaptive-docs results
//
// It asserts only that aegis served requests, as it is a peer; package
// adaptive's TestSimulation asserts the goals of this module's limiters.
func TestAdaptiveSimulation(t *testing.T) {
	loads, subjects := []float64{3}, AdaptiveSubjects()
	if *adaptiveDocs != "" {
		loads = []float64{0.5, 1, 3}
	} else { // package adaptive's TestSimulation runs this module's subjects
		subjects = subjects[len(subjects)-1:]
	}
	var rows, curves []adaptivesim.Row
	for _, s := range subjects {
		for _, load := range loads {
			var r adaptivesim.Result
			if s.Name == "aegis BBR" { // it reads time.Now: run it on a bubble's fake time
				synctest.Test(t, func(*testing.T) { r = adaptivesim.Run(s.New(nil), load, 1, BubbleAt()) })
			} else {
				clk := throttletest.NewClock()
				r = adaptivesim.Run(s.New(clk), load, 1, adaptivesim.OnClock(clk))
			}
			row := adaptivesim.Row{Name: s.Name, Load: load, Result: r}
			rows = append(rows, row)
			if load == 3 {
				curves = append(curves, row)
			}
			if r.Goodput == 0 {
				t.Errorf("%s at %.1f×: served nothing", s.Name, load)
			}
			if miss := r.Goals(load); len(miss) > 0 {
				t.Logf("%s at %.1f× misses: %s", s.Name, load, strings.Join(miss, "; "))
			}
		}
	}
	var b strings.Builder
	adaptivesim.WriteTable(&b, rows)
	b.WriteString("\nAt 3× load, every 10 s: limit / p99 (ms) / served per second\n\n")
	adaptivesim.WriteCurves(&b, curves)
	t.Log("\n" + b.String())
	dir := *adaptiveDocs
	if dir == "" {
		dir = t.TempDir()
	}
	files, err := WriteAdaptiveCharts(dir, curves)
	if err != nil || len(files) != 3 {
		t.Fatalf("WriteAdaptiveCharts: %v, %v", files, err)
	}
	t.Log("wrote", files)
}

// TestAdaptiveShapes runs aegis's BBR at 1× and 3× load on the backends
// of adaptivesim.Shapes, beside which package adaptive's TestShapes runs
// this module's limiters, and prints its rows of the table of
// docs/adaptive.md (with -adaptive-docs; it takes about a minute):
//
//	cd benchmarks && go test -run TestAdaptiveShapes -v . -args -adaptive-docs results
//
// It asserts nothing of aegis, a peer, but that it served requests.
func TestAdaptiveShapes(t *testing.T) {
	if *adaptiveDocs == "" {
		t.Skip("with -adaptive-docs only")
	}
	aegis := AdaptiveSubjects()[len(AdaptiveSubjects())-1]
	var rows []adaptivesim.ShapeRow
	for _, b := range adaptivesim.Shapes() {
		unloaded := b.Unloaded()
		for _, load := range []float64{1, 3} {
			var r adaptivesim.Result
			synctest.Test(t, func(*testing.T) { r = adaptivesim.RunOn(b, aegis.New(nil), load, 1, BubbleAt(), unloaded) })
			if r.Goodput == 0 {
				t.Errorf("%s at %.0f×: served nothing", b.Name, load)
			}
			rows = append(rows, adaptivesim.ShapeRow{Shape: b.Name, Unloaded: unloaded,
				Row: adaptivesim.Row{Name: aegis.Name, Load: load, Result: r}, Miss: r.ShapeGoals(load, unloaded)})
		}
	}
	var out strings.Builder
	adaptivesim.WriteShapes(&out, rows)
	t.Log("\n" + out.String())
}
