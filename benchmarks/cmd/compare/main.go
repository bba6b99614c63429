// Command compare measures this module's rate limiters against peer
// libraries on identical workloads, prints a one-screen summary (each
// limiter's speed beside x/time/rate's and its accuracy), and writes the
// full Markdown tables, the raw samples and the charts.
//
// Run it from the module root:
//
//	go run ./benchmarks/cmd/compare             # quick mode (about 30 s), into benchmarks/results/quick
//	go run ./benchmarks/cmd/compare -thorough   # the committed results docs/performance.md cites
//	go run ./benchmarks/cmd/compare -guard      # fail if one of ours is slower than x/time/rate
//
// Speed: every (workload, limiter) pair is measured -count times with
// testing.Benchmark, rounds interleaved, and the median is reported.
// Accuracy: deterministic traces replayed on virtual time, or on the wall
// clock for limiters that take no clock. Contention: 8 goroutines on one
// key, wall clock. The tables also go to comparison.md, the raw samples
// (benchstat format) to bench.txt and the charts (PNG) next to them, in
// benchmarks/results/ with -thorough (the results docs/performance.md cites) and in benchmarks/results/quick/
// otherwise, or in the directory given with -docs.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/throttlekit/throttle/benchmarks"
)

func main() {
	o, err := parseOptions()
	if err == nil {
		err = run(o)
	}
	if errors.Is(err, errGuard) {
		fmt.Fprintln(os.Stderr, "compare: guard failed: one of ours is slower than x/time/rate (see the Guard table)")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// errGuard is the failure of -guard.
var errGuard = errors.New("guard failed")

// options are the command's settings, defaults resolved.
type options struct {
	mode                   string // quick or thorough
	thorough               bool
	count, keyedCount      int
	benchtime              time.Duration
	docs                   string // "" writes no files
	guard                  bool
	guardRatio             float64
	speed, accuracy        bool
	markdown               bool
	subjects               []benchmarks.Subject
	workloads              []benchmarks.Workload
	realWindow, contention time.Duration
}

func parseOptions() (options, error) {
	thorough := flag.Bool("thorough", false, "thorough mode: all workloads (1M keys too), more and longer samples, longer wall-clock runs")
	count := flag.Int("count", 0, "speed samples per case on one key (default 5 quick, 10 thorough)")
	keyedCount := flag.Int("keyed-count", 0, "speed samples per case on many keys, each visiting every key once (default 3 quick, 6 thorough: benchstat needs 6 for a confidence interval)")
	benchtime := flag.Duration("benchtime", 0, "duration of one speed sample on one key (default 10ms quick, 100ms thorough)")
	docs := flag.String("docs", "", "directory for comparison.md, bench.txt and the PNG charts (default benchmarks/results with -thorough, benchmarks/results/quick otherwise; \"-\" to write none)")
	guard := flag.Bool("guard", false, "exit with status 2 when one of our single-key Allow (serial, allowed or denied) is slower than x/time/rate's in this run, by the median ratio of rounds and by the ratio of the fastest samples")
	guardRatio := flag.Float64("guard-ratio", 1.0, "the largest ratio of our ns/op to x/time/rate's that -guard accepts")
	speed := flag.Bool("speed", true, "run the speed benchmarks")
	accuracy := flag.Bool("accuracy", true, "run the accuracy traces and the contention check")
	markdown := flag.Bool("markdown", false, "print the full Markdown tables on standard output too, not only the summary")
	only := flag.String("only", "", "comma-separated subject names to run (default all)")
	flag.Parse()

	o := options{mode: "quick", thorough: *thorough, count: *count, keyedCount: *keyedCount, benchtime: *benchtime,
		docs: *docs, guard: *guard, guardRatio: *guardRatio, speed: *speed, accuracy: *accuracy, markdown: *markdown,
		subjects: benchmarks.Subjects(), workloads: benchmarks.QuickWorkloads,
		realWindow: 50 * time.Millisecond, contention: 300 * time.Millisecond}
	if *only != "" {
		o.subjects = nil
		for _, n := range strings.Split(*only, ",") {
			s, ok := benchmarks.Lookup(strings.TrimSpace(n))
			if !ok {
				return o, fmt.Errorf("unknown subject %q", n)
			}
			o.subjects = append(o.subjects, s)
		}
	}
	if o.thorough {
		o.mode, o.workloads = "thorough", benchmarks.ThoroughWorkloads
		o.realWindow, o.contention = 200*time.Millisecond, 3*time.Second
		o.count, o.keyedCount, o.benchtime = cmp(o.count, 10), cmp(o.keyedCount, 6), cmp(o.benchtime, 100*time.Millisecond)
	} else {
		o.count, o.keyedCount, o.benchtime = cmp(o.count, 5), cmp(o.keyedCount, 3), cmp(o.benchtime, 10*time.Millisecond)
	}
	if o.guard && o.speed && !contains(o.subjects, "x/time/rate") {
		s, _ := benchmarks.Lookup("x/time/rate")
		o.subjects = append(o.subjects, s)
	}
	switch {
	case o.docs == "-":
		o.docs = ""
	case o.docs != "":
	case o.thorough:
		o.docs = filepath.Join("benchmarks", "results") // the committed results docs/performance.md cites
	default:
		o.docs = filepath.Join("benchmarks", "results", "quick") // never overwrites them
	}
	return o, nil
}

// run measures, writes the Markdown report and charts into o.docs, and
// prints the summary and the paths it wrote. It returns errGuard when the
// guard fails.
func run(o options) error {
	if o.docs != "" {
		if err := os.MkdirAll(o.docs, 0o755); err != nil {
			return err
		}
	}
	var md bytes.Buffer
	out := io.Writer(&md)
	if o.markdown {
		out = io.MultiWriter(os.Stdout, &md)
	}
	started := time.Now()
	fmt.Fprintf(out, "## Comparison (%s mode)\n\n", o.mode)
	fmt.Fprintf(out, "%s, %s/%s, %d CPUs (GOMAXPROCS %d)%s.\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel())
	fmt.Fprintf(out, "Regenerate with `go run ./benchmarks/cmd/compare%s`.\n\n", map[bool]string{true: " -thorough"}[o.thorough])

	res, written, err := measure(out, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n### Where the peers differ\n\n")
	if err := benchmarks.NotesTable(o.subjects).Write(out); err != nil {
		return err
	}
	charts := 0
	if o.docs != "" {
		path, files, err := writeDocs(out, &md, o, res)
		if err != nil {
			return err
		}
		written = append([]string{path}, append(written, files...)...)
		charts = len(files)
	}
	fmt.Printf("Comparison, %s mode, in %v (%d CPUs, %s)\n\n", o.mode, time.Since(started).Round(time.Second), runtime.NumCPU(), runtime.Version())
	if err := benchmarks.Summary(os.Stdout, res.speed, res.acc, res.overhead, res.perKey); err != nil {
		return err
	}
	if len(written) > 0 {
		fmt.Printf("\nFull tables: %s; raw samples (benchstat): %s; %d charts beside them.\n", written[0], filepath.Join(o.docs, "bench.txt"), charts)
	}
	if res.failed {
		return errGuard
	}
	return nil
}

// results is what a run measured.
type results struct {
	speed    []benchmarks.SpeedResult
	acc      []benchmarks.AccuracyResult
	failed   bool               // the guard failed
	overhead map[string]float64 // the loop alone, per workload
	perKey   map[string]float64 // heap per tracked key, per subject
}

// measure runs the sections o asks for, writing their tables to out and
// the raw speed samples beside the docs, whose path it returns.
func measure(out io.Writer, o options) (res results, written []string, err error) {
	if o.speed {
		if res.speed, res.failed, err = speedSection(out, o); err != nil {
			return res, nil, err
		}
		if o.docs != "" {
			path := filepath.Join(o.docs, "bench.txt")
			if err := writeFile(path, func(w io.Writer) error { return benchmarks.WriteBenchFormat(w, res.speed, runtime.GOMAXPROCS(0)) }); err != nil {
				return res, nil, err
			}
			written = append(written, path)
		}
		if res.overhead, res.perKey, err = costSection(out, o); err != nil {
			return res, nil, err
		}
	}
	if o.accuracy {
		if res.acc, err = accuracySection(out, o); err != nil {
			return res, nil, err
		}
	}
	return res, written, nil
}

// writeDocs draws the charts into o.docs, links them from the report
// (out, which writes md), and writes md there. It returns the report's
// path and the charts'.
func writeDocs(out io.Writer, md *bytes.Buffer, o options, res results) (path string, charts []string, err error) {
	files, err := benchmarks.WriteCharts(o.docs, res.speed, res.acc)
	if err != nil {
		return "", nil, err
	}
	if len(files) > 0 {
		fmt.Fprintln(out)
		for _, f := range files {
			fmt.Fprintf(out, "![%s](%s)\n", strings.TrimSuffix(filepath.Base(f), ".png"), filepath.Base(f))
		}
	}
	path = filepath.Join(o.docs, "comparison.md")
	if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
		return "", nil, err
	}
	return path, files, nil
}

// speedSection measures speed, writes its tables and the guard's, and
// reports whether the guard failed (after its confirmations).
func speedSection(out io.Writer, o options) (res []benchmarks.SpeedResult, failed bool, err error) {
	res, err = benchmarks.RunSpeed(benchmarks.SpeedOptions{
		Subjects: o.subjects, Workloads: o.workloads, Count: o.count, KeyedCount: o.keyedCount, BenchTime: o.benchtime, Progress: os.Stderr,
	})
	if err != nil {
		return nil, false, err
	}
	ns, mem := benchmarks.SpeedTables(res)
	fmt.Fprintf(out, "### Speed: ns/op (median of %d samples of ~%v each on one key; of %d samples visiting every key once on many keys, each on an instance prepared afresh)\n\n", o.count, o.benchtime, o.keyedCount)
	fmt.Fprintln(out, "Allowed path: limit 1,000,000 per 10 ms (never reached). Denied path: limit 1 per hour, spent before timing.")
	fmt.Fprintln(out, "A keyed limiter runs the one-key workloads on one fixed key. ∥ = b.RunParallel on every CPU.")
	fmt.Fprintln(out, "Keys are distinct strings, built once and shared by all limiters; each limiter sees all of them before timing starts, and timed calls visit them in a fixed shuffle of that order (as traffic does; visiting keys in the order they were first seen hides a cache miss from limiters that allocate per key).")
	fmt.Fprintln(out, "† = more than 1% of the calls did not take the intended path.")
	fmt.Fprintln(out)
	if err := ns.Write(out); err != nil {
		return nil, false, err
	}
	fmt.Fprintf(out, "\n### Speed: B/op, allocs/op (median)\n\n")
	if err := mem.Write(out); err != nil {
		return nil, false, err
	}
	if g := benchmarks.Guard(res, o.guardRatio); len(g) > 0 {
		fmt.Fprintf(out, "\n### Guard: ours vs x/time/rate, same run, serial single key\n\n")
		if err := benchmarks.GuardTable(g, o.guardRatio).Write(out); err != nil {
			return nil, false, err
		}
		if failed, err = confirm(out, g, o.subjects, o.count, o.benchtime, o.guardRatio); err != nil {
			return nil, false, err
		}
	}
	fmt.Fprintln(out)
	return res, failed && o.guard, nil
}

// costSection measures what the speed loop alone costs per call and the
// heap each keyed subject holds per key, and writes the latter.
func costSection(out io.Writer, o options) (overhead, perKey map[string]float64, err error) {
	overhead, perKey = map[string]float64{}, map[string]float64{}
	for _, w := range []benchmarks.Workload{benchmarks.Allow, benchmarks.Keys100k} {
		if overhead[w.Slug], err = benchmarks.Overhead(w, o.count, o.benchtime); err != nil {
			return nil, nil, err
		}
	}
	fmt.Fprintf(out, "### Memory per tracked key\n\nHeap held after 100,000 distinct keys each made one request, less the heap before, per key (the key strings excluded; – where a background cleaner freed more than was added):\n\n")
	for _, s := range o.subjects {
		if !s.Keyed || s.Blocks {
			continue
		}
		b, err := benchmarks.BytesPerKey(s, 100_000)
		if err != nil {
			return nil, nil, err
		}
		if b >= 0 {
			perKey[s.Name] = b
			fmt.Fprintf(out, "- %s: %.0f B\n", s.Name, b)
		} else {
			fmt.Fprintf(out, "- %s: –\n", s.Name)
		}
	}
	fmt.Fprintln(out)
	return overhead, perKey, nil
}

// accuracySection replays the traces and the contention check, and writes
// their tables.
func accuracySection(out io.Writer, o options) ([]benchmarks.AccuracyResult, error) {
	t0 := time.Now()
	res, err := benchmarks.RunAccuracy(benchmarks.AccuracyOptions{
		Subjects: o.subjects, Traces: benchmarks.Traces(100, time.Second), RealWindow: o.realWindow,
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "accuracy: traces in %v\n", time.Since(t0).Round(time.Millisecond))
	ratio, window := benchmarks.AccuracyTables(res)
	fmt.Fprintf(out, "### Accuracy: admitted / ideal\n\n")
	fmt.Fprintln(out, "Limit 100 per window of 1 s (virtual time). Ideal = what an exact token bucket of burst 100 refilled at 100/s admits on the same arrivals,")
	fmt.Fprintf(out, "so a window limiter scores below 1 by design and anything above 1 over-admits. ⏱ = takes no clock: replayed on the wall clock with a %v window, scored on the actual call times.\n", o.realWindow)
	fmt.Fprintln(out, "Traces (ten windows each): steady 2× = evenly spaced at twice the rate; on/off = 2×limit in half a window then 1.5 windows idle;")
	fmt.Fprintln(out, "Poisson 1.5× = Poisson arrivals at 1.5× the rate; boundary = 2×limit within ±1% of every other window edge; 200 keys = limit/10 per key, each at 2× its rate;")
	fmt.Fprintln(out, "weighted = n uniform in [1, 20] at 2× the rate in units; stale reads = 4× the rate, one call in five deciding with a clock read up to 10 ms old")
	fmt.Fprintln(out, "(a goroutine preempted between reading the clock and deciding; virtual time only, ⏱ limiters see plain 4×); burst+poll = 2×limit at once, then a request every W/1000.")
	fmt.Fprintln(out)
	if err := ratio.Write(out); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\n### Accuracy: most admitted in any one window / limit, and recovery\n\n")
	fmt.Fprintln(out, "1.00 = never more than the limit in any window of that length. A token bucket allows up to 2 (a full burst, then a window of refill).")
	fmt.Fprintln(out, "Recovery = time from the first denial to the next admission when polling every W/1000, in windows.")
	fmt.Fprintln(out)
	if err := window.Write(out); err != nil {
		return nil, err
	}
	return res, contentionSection(out, o)
}

// contentionSection runs 8 goroutines on one key per subject and writes
// the table.
func contentionSection(out io.Writer, o options) error {
	t0 := time.Now()
	var cres []benchmarks.ContentionResult
	cfg := benchmarks.Config{Limit: 100, Window: 100 * time.Millisecond}
	for _, s := range o.subjects {
		r, err := benchmarks.Contention(s, cfg, 8, o.contention)
		if err != nil {
			return err
		}
		cres = append(cres, r)
	}
	fmt.Fprintf(os.Stderr, "accuracy: contention in %v\n", time.Since(t0).Round(time.Millisecond))
	fmt.Fprintf(out, "\n### Contention: 8 goroutines on one key for %v, wall clock\n\n", o.contention)
	fmt.Fprintln(out, "Limit 100 per 100 ms. Ideal = what an exact token bucket (burst 100, 1000/s) admits to callers that never pause, over the 50 µs slices")
	fmt.Fprintln(out, "of time in which calls were actually made (a busy machine may starve the goroutines for a while); for the pacers, 1000/s × the time of the last call.")
	fmt.Fprintln(out, "Window limiters score below 1 by design; what matters is that none goes above its bound under contention. Admission times are")
	fmt.Fprintln(out, "read when Allow returns, so \"max in a window\" can exceed a limiter's own bound by the few calls preempted between the decision and that reading.")
	fmt.Fprintln(out)
	return benchmarks.ContentionTable(cres).Write(out)
}

// writeFile creates path and writes it with f.
func writeFile(path string, f func(io.Writer) error) error {
	w, err := os.Create(path)
	if err != nil {
		return err
	}
	err = f(w)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// confirm re-measures, on the serial single-key workloads only, each of
// ours that failed the guard, beside x/time/rate, with three times the
// samples, twice at most: a subject fails only if every run says so, so
// that one disturbed run on a busy machine does not fail CI, while a real
// regression, which shows in every run, still does.
func confirm(out io.Writer, g []benchmarks.GuardResult, subjects []benchmarks.Subject, count int, benchtime time.Duration, maxRatio float64) (bool, error) {
	failing := map[string]bool{}
	for _, r := range g {
		if r.Fail {
			failing[r.Subject] = true
		}
	}
	peer, _ := benchmarks.Lookup("x/time/rate")
	for try := 1; len(failing) > 0 && try <= 2; try++ {
		again := []benchmarks.Subject{peer}
		for _, s := range subjects {
			if failing[s.Name] {
				again = append(again, s)
			}
		}
		res, err := benchmarks.RunSpeed(benchmarks.SpeedOptions{
			Subjects: again, Workloads: []benchmarks.Workload{benchmarks.Allow, benchmarks.Deny},
			Count: 3 * count, BenchTime: benchtime,
		})
		if err != nil {
			return false, err
		}
		rg := benchmarks.Guard(res, maxRatio)
		fmt.Fprintf(out, "\n### Guard, confirmation %d of the failures above\n\n", try)
		if err := benchmarks.GuardTable(rg, maxRatio).Write(out); err != nil {
			return false, err
		}
		still := map[string]bool{}
		for _, r := range rg {
			if r.Fail {
				still[r.Subject] = true
			}
		}
		failing = still
	}
	return len(failing) > 0, nil
}

func cmp[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func contains(ss []benchmarks.Subject, name string) bool {
	for _, s := range ss {
		if s.Name == name {
			return true
		}
	}
	return false
}

// cpuModel returns ", <model name>" from /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return ", " + strings.TrimSpace(v)
		}
	}
	return ""
}
