package benchmarks

import (
	"fmt"
	"image/color"
	"path/filepath"
	"strings"
	"time"

	"github.com/throttlekit/throttle/internal/adaptivesim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Chart file names written by WriteAdaptiveCharts.
const (
	ChartAdaptiveLimit   = "adaptive-limit.png"
	ChartAdaptiveLatency = "adaptive-p99.png"
	ChartAdaptiveServed  = "adaptive-served.png"
)

// WriteAdaptiveCharts draws the curves of adaptive simulation runs (one
// load) into dir: each subject's limit, the p99 latency of the requests
// that finished and how many they were, second by second, through the
// halving of the backend's capacity and its recovery. Fixed limits are
// dashed. It returns the files written.
func WriteAdaptiveCharts(dir string, rows []adaptivesim.Row) ([]string, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	load := fmt.Sprintf("%g× load", rows[0].Load)
	var files []string
	for _, c := range []adaptiveCurve{
		{ChartAdaptiveLimit, "Concurrency limit, " + load, "limit (requests in flight)",
			func(r adaptivesim.Result, s int) float64 { return float64(r.Limits[s]) },
			adaptivesim.Servers, fmt.Sprintf("the %d servers", adaptivesim.Servers)},
		{ChartAdaptiveLatency, "p99 latency of admitted requests, " + load, "p99 of each second, ms",
			func(r adaptivesim.Result, s int) float64 { return ms(r.SecondP99[s]) },
			ms(2 * adaptivesim.P99), fmt.Sprintf("the bound, 2× the unloaded p99 of %.1f ms", ms(adaptivesim.P99))},
		{ChartAdaptiveServed, "Requests served, " + load, "requests served in each second",
			func(r adaptivesim.Result, s int) float64 { return float64(r.SecondServed[s]) },
			adaptivesim.Capacity, fmt.Sprintf("the full capacity, %.0f/s", adaptivesim.Capacity)},
	} {
		p, err := adaptiveChart(c, rows)
		if err != nil {
			return nil, err
		}
		f := filepath.Join(dir, c.file)
		if err := save(p, 10*vg.Inch, 5.5*vg.Inch, f); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// adaptiveCurve is one chart of WriteAdaptiveCharts: a measure v of each
// second of a run, and a gray horizontal line at mark, which markText
// names.
type adaptiveCurve struct {
	file, title, y string
	v              func(r adaptivesim.Result, s int) float64
	mark           float64
	markText       string
}

// adaptiveChart plots c for every row, over the gray lines of c's mark
// and of the halving and the recovery.
func adaptiveChart(c adaptiveCurve, rows []adaptivesim.Row) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = fmt.Sprintf("time, s (capacity halves at %.0f s and recovers at %.0f s; gray: %s)",
		sec(adaptivesim.HalveAt), sec(adaptivesim.RecoverAt), c.markText)
	p.Y.Label.Text = c.y
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	end := float64(adaptivesim.End / time.Second)
	for _, ref := range []plotter.XYs{
		{{X: 0, Y: c.mark}, {X: end, Y: c.mark}},
		{{X: sec(adaptivesim.HalveAt), Y: 0}, {X: sec(adaptivesim.HalveAt), Y: 1e9}},
		{{X: sec(adaptivesim.RecoverAt), Y: 0}, {X: sec(adaptivesim.RecoverAt), Y: 1e9}},
	} {
		l, err := plotter.NewLine(ref)
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 150}
		l.Width = vg.Points(1)
		p.Add(l)
	}
	var most float64
	for i, row := range rows {
		pts := make(plotter.XYs, len(row.Result.Limits))
		for s := range pts {
			pts[s] = plotter.XY{X: float64(s) + 1, Y: c.v(row.Result, s)}
			most = max(most, pts[s].Y)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		if strings.HasPrefix(row.Name, "fixed") {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(row.Name, l)
	}
	p.X.Min, p.X.Max = 0, end
	p.Y.Min, p.Y.Max = 0, most*1.3 // room for the legend
	p.X.Tick.Marker = wholeTicks{}
	p.Y.Tick.Marker = wholeTicks{}
	return p, nil
}

func ms(d time.Duration) float64  { return float64(d) / float64(time.Millisecond) }
func sec(d time.Duration) float64 { return float64(d) / float64(time.Second) }
