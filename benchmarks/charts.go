package benchmarks

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	vgdraw "gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart file names written by WriteCharts.
const (
	ChartBoundary = "boundary-attack.png"
	ChartSpeed    = "speed-single-key.png"
	ChartKeys     = "speed-keys.png"
)

// WriteCharts draws the charts into dir and returns the files written.
func WriteCharts(dir string, speed []SpeedResult, acc []AccuracyResult) ([]string, error) {
	var files []string
	if p, err := boundaryChart(acc); err != nil {
		return nil, err
	} else if p != nil {
		f := filepath.Join(dir, ChartBoundary)
		if err := save(p, 9*vg.Inch, 6*vg.Inch, f); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	for _, c := range []struct {
		file string
		ws   []Workload
		what string
	}{
		{ChartSpeed, []Workload{Allow, AllowPar, Deny, DenyPar}, "one key"},
		{ChartKeys, []Workload{Keys100k, Keys100kPar, Keys1M, Keys1MPar}, "many keys"},
	} {
		p, n, err := speedChart(speed, c.ws, c.what)
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		f := filepath.Join(dir, c.file)
		if err := save(p, 9*vg.Inch, vg.Length(1.6+0.32*float64(n))*vg.Inch, f); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

func init() {
	// Sans-serif text, from the fonts compiled into the program: the
	// glyphs charts use are all in it (no symbols it lacks).
	plot.DefaultFont.Variant = "Sans"
	plotter.DefaultFont.Variant = "Sans"
}

// save writes p as a PNG image, its text drawn with the fonts compiled
// into the program, so that it reads the same in any viewer whatever
// fonts the viewer has.
func save(p *plot.Plot, w, h vg.Length, file string) error {
	c := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	m := 0.25 * vg.Inch
	p.Draw(vgdraw.Crop(vgdraw.New(c), m, -m/2, m/4, -m/4))
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(f, quantize(c.Image())); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// quantize maps img onto a small palette: the chart colors and black,
// each blended with white in eight steps (the shades antialiasing makes).
// An indexed PNG is a quarter of the size of a true-color one, and the
// charts ship in the module's zip.
func quantize(img image.Image) *image.Paletted {
	var pal color.Palette
	for _, c := range append([]color.Color{color.Black}, palette...) {
		r, g, b, _ := c.RGBA()
		for i := range 8 {
			mix := func(v uint32) uint8 { return uint8((int(v>>8)*(8-i) + 255*i) / 8) }
			pal = append(pal, color.RGBA{mix(r), mix(g), mix(b), 0xff})
		}
	}
	pal = append(pal, color.White)
	out := image.NewPaletted(img.Bounds(), pal)
	draw.Draw(out, out.Bounds(), img, img.Bounds().Min, draw.Src)
	return out
}

// palette holds ten colors that stay apart (Tableau 10).
var palette = []color.Color{
	color.RGBA{0x4e, 0x79, 0xa7, 0xff}, color.RGBA{0xf2, 0x8e, 0x2b, 0xff},
	color.RGBA{0xe1, 0x57, 0x59, 0xff}, color.RGBA{0x76, 0xb7, 0xb2, 0xff},
	color.RGBA{0x59, 0xa1, 0x4f, 0xff}, color.RGBA{0xed, 0xc9, 0x48, 0xff},
	color.RGBA{0xb0, 0x7a, 0xa1, 0xff}, color.RGBA{0xff, 0x9d, 0xa7, 0xff},
	color.RGBA{0x9c, 0x75, 0x5f, 0xff}, color.RGBA{0xba, 0xb0, 0xac, 0xff},
}

// shortNames joins subject names for a legend, writing the types of one
// of our packages once: "tokenbucket.{Bucket,Limiter}".
func shortNames(names []string) string {
	var out []string
	group := map[string][]string{}
	for _, n := range names {
		pkg, typ, ok := strings.Cut(n, ".")
		if !ok || strings.ContainsAny(n, "/ ") {
			out = append(out, n)
			continue
		}
		if group[pkg] == nil {
			out = append(out, pkg)
		}
		group[pkg] = append(group[pkg], typ)
	}
	for i, o := range out {
		if g := group[o]; len(g) == 1 {
			out[i] = o + "." + g[0]
		} else if len(g) > 1 {
			out[i] = o + ".{" + strings.Join(g, ",") + "}"
		}
	}
	return strings.Join(out, ", ")
}

// boundaryChart plots, for every subject that ran the boundary attack,
// the units admitted in the trailing window over time, in limits.
func boundaryChart(acc []AccuracyResult) (*plot.Plot, error) {
	lines := boundaryLines(acc)
	if len(lines) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Boundary attack: admitted in the trailing window"
	p.X.Label.Text = "time, in windows (2×limit offered within ±1% of the window edges 1, 3, 5, 7 and 9)"
	p.Y.Label.Text = "admitted in the trailing window ÷ limit (dashed: wall clock)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Color = color.Gray{Y: 120}
	one.Width = vg.Points(0.5)
	p.Add(one)
	for i, ln := range lines {
		l, err := plotter.NewLine(trailingWindow(ln.r))
		if err != nil {
			return nil, err
		}
		l.Color = palette[i%len(palette)]
		if ln.r.RealTime {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(shortNames(ln.names), l)
	}
	p.Y.Min = 0
	p.Y.Max = 3.2
	p.X.Tick.Marker = wholeTicks{}
	return p, nil
}

// boundaryLine is a line of boundaryChart: the run r, and the names of
// the subjects whose runs admitted exactly the same requests.
type boundaryLine struct {
	r     AccuracyResult
	names []string
}

// boundaryLines are the lines of the runs of the boundary attack in acc.
func boundaryLines(acc []AccuracyResult) []boundaryLine {
	var lines []boundaryLine
	for _, r := range acc {
		if r.Trace != "boundary" {
			continue
		}
		name := r.Subject.Name
		if r.RealTime {
			name += " (wall clock)"
		}
		i := slices.IndexFunc(lines, func(l boundaryLine) bool {
			return !r.RealTime && !l.r.RealTime && slices.Equal(l.r.Timeline, r.Timeline)
		})
		if i < 0 {
			lines = append(lines, boundaryLine{r: r, names: []string{name}})
		} else {
			lines[i].names = append(lines[i].names, name)
		}
	}
	return lines
}

// trailingWindow samples the units r admitted in the trailing window, in
// limits, over ten windows: a step function, kept only where it changes.
func trailingWindow(r AccuracyResult) plotter.XYs {
	const steps = 2000        // samples over ten windows
	w := float64(time.Second) // timelines are normalized to 1 s windows
	pts := make(plotter.XYs, 0, steps+1)
	var sum int64
	lo, hi := 0, 0
	for k := 0; k <= steps; k++ {
		t := float64(k) * 10 * w / steps
		for hi < len(r.Timeline) && float64(r.Timeline[hi].At) <= t {
			sum += int64(r.Timeline[hi].N)
			hi++
		}
		for lo < hi && float64(r.Timeline[lo].At) <= t-w {
			sum -= int64(r.Timeline[lo].N)
			lo++
		}
		y := float64(sum) / float64(r.Limit)
		if n := len(pts); n >= 2 && pts[n-1].Y == y && pts[n-2].Y == y {
			pts[n-1].X = t / w
			continue
		}
		pts = append(pts, plotter.XY{X: t / w, Y: y})
	}
	return pts
}

// wholeTicks are the default ticks labelled without spurious decimals:
// whole numbers when every labelled tick is one.
type wholeTicks struct{}

// Ticks implements plot.Ticker.
func (wholeTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i, t := range ts {
		if t.Label != "" && t.Value == math.Trunc(t.Value) {
			ts[i].Label = strconv.FormatFloat(t.Value, 'f', 0, 64)
		}
	}
	return ts
}

// speedChart draws median ns/op per subject for the workloads ws as
// grouped horizontal bars. It returns the number of subjects.
func speedChart(res []SpeedResult, ws []Workload, what string) (*plot.Plot, int, error) {
	present := slices.DeleteFunc(slices.Clone(ws), func(w Workload) bool { return !ran(res, w) })
	if len(present) == 0 {
		return nil, 0, nil
	}
	subjects := fastestFirst(res, present[0])
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Allow, %s: median ns/op (lower is better)", what)
	p.X.Label.Text = "ns per call (on every CPU: b.RunParallel on all CPUs at once)"
	p.X.Tick.Marker = wholeTicks{}
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	names := make([]string, len(subjects))
	for i, s := range subjects {
		names[i] = s.Name
		if s.Ours {
			names[i] = s.Name + " (ours)"
		}
	}
	barW := vg.Points(18 / float64(len(present)))
	var most float64
	for j, w := range present {
		vals := make(plotter.Values, len(subjects))
		for i, s := range subjects {
			if r, ok := find(res, s, w); ok {
				vals[i] = r.Median().NsPerOp
			}
		}
		b, err := plotter.NewBarChart(vals, barW)
		if err != nil {
			return nil, 0, err
		}
		b.Horizontal = true
		b.LineStyle.Width = 0
		b.Color = palette[j%len(palette)]
		// The first workload on top of each group, as in the legend.
		b.Offset = barW * vg.Length(float64(len(present)-1)/2-float64(j))
		p.Add(b)
		p.Legend.Add(strings.ReplaceAll(w.Name, "∥", "on every CPU"), b)
		for _, r := range res {
			if r.Workload.Slug == w.Slug {
				most = max(most, r.Median().NsPerOp)
			}
		}
	}
	p.Legend.Top = true
	p.Legend.XOffs = 0
	p.NominalY(names...)
	p.X.Max = most * 1.3 // room on the right for the legend
	return p, len(subjects), nil
}

// ran reports whether res holds a result of workload w.
func ran(res []SpeedResult, w Workload) bool {
	return slices.ContainsFunc(res, func(r SpeedResult) bool { return r.Workload.Slug == w.Slug })
}

// fastestFirst is the subjects that ran w in res, slowest first on w:
// the nominal Y axis of a chart runs bottom-up, so the fastest is on top.
func fastestFirst(res []SpeedResult, w Workload) []Subject {
	var subjects []Subject
	for _, s := range subjectsOf(res, func(r SpeedResult) Subject { return r.Subject }) {
		if _, ok := find(res, s, w); ok {
			subjects = append(subjects, s)
		}
	}
	first := func(s Subject) float64 { r, _ := find(res, s, w); return r.Median().NsPerOp }
	slices.SortStableFunc(subjects, func(a, b Subject) int {
		switch fa, fb := first(a), first(b); {
		case fa > fb:
			return -1
		case fa < fb:
			return 1
		}
		return 0
	})
	return subjects
}
