// Command compare measures this module's rate limiters against peer
// libraries on identical workloads, prints the results as Markdown
// tables, and draws charts.
//
// Run it from the module root:
//
//	go run ./benchmarks/cmd/compare             # quick mode (about 30 s), into docs/quick
//	go run ./benchmarks/cmd/compare -thorough   # the numbers for the README
//	go run ./benchmarks/cmd/compare -guard      # fail if one of ours is slower than x/time/rate
//
// Speed: every (workload, limiter) pair is measured -count times with
// testing.Benchmark, rounds interleaved, and the median is reported.
// Accuracy: deterministic traces replayed on virtual time, or on the wall
// clock for limiters that take no clock. Contention: 8 goroutines on one
// key, wall clock. The tables also go to comparison.md, the raw samples
// (benchstat format) to bench.txt and the charts (SVG) next to them, in
// docs/ with -thorough (the results the README cites) and in docs/quick/
// otherwise, or in the directory given with -docs.
package main

import (
	"bytes"
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
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run() error {
	thorough := flag.Bool("thorough", false, "thorough mode: all workloads (1M keys too), more and longer samples, longer wall-clock runs")
	count := flag.Int("count", 0, "speed samples per case on one key (default 5 quick, 10 thorough)")
	keyedCount := flag.Int("keyed-count", 0, "speed samples per case on many keys, each visiting every key once (default 3 quick, 6 thorough: benchstat needs 6 for a confidence interval)")
	benchtime := flag.Duration("benchtime", 0, "duration of one speed sample on one key (default 10ms quick, 100ms thorough)")
	docs := flag.String("docs", "", "directory for comparison.md, bench.txt and the SVG charts (default docs with -thorough, docs/quick otherwise; \"-\" to write none)")
	guard := flag.Bool("guard", false, "exit with status 2 when one of our single-key Allow (serial, allowed or denied) is slower than x/time/rate's in this run, by the median ratio of rounds and by the ratio of the fastest samples")
	guardRatio := flag.Float64("guard-ratio", 1.0, "the largest ratio of our ns/op to x/time/rate's that -guard accepts")
	speed := flag.Bool("speed", true, "run the speed benchmarks")
	accuracy := flag.Bool("accuracy", true, "run the accuracy traces and the contention check")
	only := flag.String("only", "", "comma-separated subject names to run (default all)")
	flag.Parse()

	subjects := benchmarks.Subjects()
	if *only != "" {
		subjects = nil
		for _, n := range strings.Split(*only, ",") {
			s, ok := benchmarks.Lookup(strings.TrimSpace(n))
			if !ok {
				return fmt.Errorf("unknown subject %q", n)
			}
			subjects = append(subjects, s)
		}
	}
	mode := "quick"
	workloads := benchmarks.QuickWorkloads
	realWindow, contention := 50*time.Millisecond, 300*time.Millisecond
	if *thorough {
		mode = "thorough"
		workloads = benchmarks.ThoroughWorkloads
		realWindow, contention = 200*time.Millisecond, 3*time.Second
		*count = cmp(*count, 10)
		*keyedCount = cmp(*keyedCount, 6)
		*benchtime = cmp(*benchtime, 100*time.Millisecond)
	} else {
		*count = cmp(*count, 5)
		*keyedCount = cmp(*keyedCount, 3)
		*benchtime = cmp(*benchtime, 10*time.Millisecond)
	}
	if *guard && *speed {
		if _, ok := benchmarks.Lookup("x/time/rate"); ok && !contains(subjects, "x/time/rate") {
			s, _ := benchmarks.Lookup("x/time/rate")
			subjects = append(subjects, s)
		}
	}
	switch {
	case *docs == "-":
		*docs = ""
	case *docs != "":
	case *thorough:
		*docs = "docs" // the committed results the README cites
	default:
		*docs = filepath.Join("docs", "quick") // never overwrites them
	}
	if *docs != "" {
		if err := os.MkdirAll(*docs, 0o755); err != nil {
			return err
		}
	}

	var md bytes.Buffer
	out := io.MultiWriter(os.Stdout, &md)
	started := time.Now()
	fmt.Fprintf(out, "## Comparison (%s mode)\n\n", mode)
	fmt.Fprintf(out, "%s, %s/%s, %d CPUs (GOMAXPROCS %d)%s.\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel())
	fmt.Fprintf(out, "Regenerate with `go run ./benchmarks/cmd/compare%s`.\n\n", map[bool]string{true: " -thorough"}[*thorough])

	var (
		speedRes []benchmarks.SpeedResult
		accRes   []benchmarks.AccuracyResult
		failed   bool
	)
	if *speed {
		var err error
		speedRes, err = benchmarks.RunSpeed(benchmarks.SpeedOptions{
			Subjects: subjects, Workloads: workloads, Count: *count, KeyedCount: *keyedCount, BenchTime: *benchtime, Progress: os.Stderr,
		})
		if err != nil {
			return err
		}
		ns, mem := benchmarks.SpeedTables(speedRes)
		fmt.Fprintf(out, "### Speed: ns/op (median of %d samples of ~%v each on one key; of %d samples visiting every key once on many keys)\n\n", *count, *benchtime, *keyedCount)
		fmt.Fprintln(out, "Allowed path: limit 1,000,000 per 10 ms (never reached). Denied path: limit 1 per hour, spent before timing.")
		fmt.Fprintln(out, "A keyed limiter runs the one-key workloads on one fixed key. ∥ = b.RunParallel on every CPU.")
		fmt.Fprintln(out, "Keys are distinct strings, built once and shared by all limiters; each limiter sees all of them before timing starts.")
		fmt.Fprintln(out, "† = more than 1% of the calls did not take the intended path.")
		fmt.Fprintln(out)
		if err := ns.Write(out); err != nil {
			return err
		}
		fmt.Fprintf(out, "\n### Speed: B/op, allocs/op (median)\n\n")
		if err := mem.Write(out); err != nil {
			return err
		}
		g := benchmarks.Guard(speedRes, *guardRatio)
		if len(g) > 0 {
			fmt.Fprintf(out, "\n### Guard: ours vs x/time/rate, same run, serial single key\n\n")
			if err := benchmarks.GuardTable(g, *guardRatio).Write(out); err != nil {
				return err
			}
			failed, err = confirm(out, g, subjects, *count, *benchtime, *guardRatio)
			if err != nil {
				return err
			}
		}
		fmt.Fprintln(out)
		if *docs != "" {
			f, err := os.Create(filepath.Join(*docs, "bench.txt"))
			if err != nil {
				return err
			}
			err = benchmarks.WriteBenchFormat(f, speedRes, runtime.GOMAXPROCS(0))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
	if *accuracy {
		t0 := time.Now()
		var err error
		accRes, err = benchmarks.RunAccuracy(benchmarks.AccuracyOptions{
			Subjects: subjects, Traces: benchmarks.Traces(100, time.Second), RealWindow: realWindow,
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "accuracy: traces in %v\n", time.Since(t0).Round(time.Millisecond))
		ratio, window := benchmarks.AccuracyTables(accRes)
		fmt.Fprintf(out, "### Accuracy: admitted / ideal\n\n")
		fmt.Fprintln(out, "Limit 100 per window of 1 s (virtual time). Ideal = what an exact token bucket of burst 100 refilled at 100/s admits on the same arrivals,")
		fmt.Fprintf(out, "so a window limiter scores below 1 by design and anything above 1 over-admits. ⏱ = takes no clock: replayed on the wall clock with a %v window, scored on the actual call times.\n", realWindow)
		fmt.Fprintln(out, "Traces (ten windows each): steady 2× = evenly spaced at twice the rate; on/off = 2×limit in half a window then 1.5 windows idle;")
		fmt.Fprintln(out, "Poisson 1.5× = Poisson arrivals at 1.5× the rate; boundary = 2×limit within ±1% of every other window edge; 200 keys = limit/10 per key, each at 2× its rate;")
		fmt.Fprintln(out, "weighted = n uniform in [1, 20] at 2× the rate in units; stale reads = 4× the rate, one call in five deciding with a clock read up to 10 ms old")
		fmt.Fprintln(out, "(a goroutine preempted between reading the clock and deciding; virtual time only, ⏱ limiters see plain 4×); burst+poll = 2×limit at once, then a request every W/1000.")
		fmt.Fprintln(out)
		if err := ratio.Write(out); err != nil {
			return err
		}
		fmt.Fprintf(out, "\n### Accuracy: most admitted in any one window / limit, and recovery\n\n")
		fmt.Fprintln(out, "1.00 = never more than the limit in any window of that length. A token bucket allows up to 2 (a full burst, then a window of refill).")
		fmt.Fprintln(out, "Recovery = time from the first denial to the next admission when polling every W/1000, in windows.")
		fmt.Fprintln(out)
		if err := window.Write(out); err != nil {
			return err
		}

		t0 = time.Now()
		var cres []benchmarks.ContentionResult
		cfg := benchmarks.Config{Limit: 100, Window: 100 * time.Millisecond}
		for _, s := range subjects {
			r, err := benchmarks.Contention(s, cfg, 8, contention)
			if err != nil {
				return err
			}
			cres = append(cres, r)
		}
		fmt.Fprintf(os.Stderr, "accuracy: contention in %v\n", time.Since(t0).Round(time.Millisecond))
		fmt.Fprintf(out, "\n### Contention: 8 goroutines on one key for %v, wall clock\n\n", contention)
		fmt.Fprintln(out, "Limit 100 per 100 ms. Ideal = what an exact token bucket (burst 100, 1000/s) admits to callers that never pause, over the 50 µs slices")
		fmt.Fprintln(out, "of time in which calls were actually made (a busy machine may starve the goroutines for a while); for the pacers, 1000/s × the time of the last call.")
		fmt.Fprintln(out, "Window limiters score below 1 by design; what matters is that none goes above its bound under contention. Admission times are")
		fmt.Fprintln(out, "read when Allow returns, so \"max in a window\" can exceed a limiter's own bound by the few calls preempted between the decision and that reading.")
		fmt.Fprintln(out)
		if err := benchmarks.ContentionTable(cres).Write(out); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\n### Where the peers differ\n\n")
	if err := benchmarks.NotesTable(subjects).Write(out); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "total:", time.Since(started).Round(time.Millisecond))

	if *docs != "" {
		files, err := benchmarks.WriteCharts(*docs, speedRes, accRes)
		if err != nil {
			return err
		}
		if len(files) > 0 {
			fmt.Fprintln(out)
			for _, f := range files {
				fmt.Fprintf(out, "![%s](%s)\n", strings.TrimSuffix(filepath.Base(f), ".svg"), filepath.Base(f))
			}
		}
		if err := os.WriteFile(filepath.Join(*docs, "comparison.md"), md.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if *guard && failed {
		fmt.Fprintln(os.Stderr, "compare: guard failed: one of ours is slower than x/time/rate (see the Guard table)")
		os.Exit(2)
	}
	return nil
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
