package faultsim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// World is the component under test, built fresh for each run inside the
// synctest bubble. Run calls its methods from one goroutine.
type World interface {
	// Apply starts a process-level fault (Pause, Crash, ClockStep, Skew,
	// Config); link faults are Net's. Run has already marked a paused or
	// crashed process down in Net, and stepped or skewed its Clock.
	Apply(e Event)
	// End ends a Pause (resume with the state kept) or a Crash (restart
	// with the state lost). Run marks the process up in Net first.
	End(e Event)
	// Check samples the invariant from the clients' side; an error is a
	// violation. Its text up to the first ':' is the violation's class in
	// Run's report.
	Check(now time.Duration) error
	// Close stops every process of the run; what they leave running
	// counts as a deadlock.
	Close()
}

// Env is what a World is built from: the test, the schedule, the fabric
// and one clock per process, and a generator for the component's own
// random choices (the load), all derived from the seed.
type Env struct {
	T      *testing.T
	Spec   Spec
	Sched  Schedule
	Net    *Net
	Clocks []*Clock
	Rand   *rand.Rand

	start time.Time
	stop  func(*failure) bool // whether a violation ends the run
	mu    sync.Mutex
	found []*failure // the first violation of each class, in order
	about string
}

// Describe sets what a failure's report says about the world (its
// topology and settings, drawn from the seed).
func (e *Env) Describe(about string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.about = about
}

// Elapsed returns the virtual time since the start of the run.
func (e *Env) Elapsed() time.Duration { return time.Since(e.start) }

// Violate records a violation found outside Check (a watchdog, a call's
// result): the run fails with the first one (of each class, with
// THROTTLE_SIM_ALL=1). Safe for concurrent use.
func (e *Env) Violate(err error) {
	f := &failure{at: time.Since(e.start), err: err}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.found {
		if g.class() == f.class() {
			return
		}
	}
	f.about = e.about
	e.found = append(e.found, f)
}

// violation returns the first violation that ends the run, nil if none.
func (e *Env) violation() *failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, f := range e.found {
		if e.stop(f) {
			return f
		}
	}
	return nil
}

// violations returns the first violation of each class.
func (e *Env) violations() []*failure {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.found)
}

// ErrLiveness is the class of a call that did not return within its
// stated time.
var ErrLiveness = errors.New("liveness")

// Within runs fn, and records a violation wrapping ErrLiveness when it
// has not returned d after it started (whether or not it returns later).
func (e *Env) Within(what string, d time.Duration, fn func()) {
	t := time.AfterFunc(d, func() { e.Violate(fmt.Errorf("%w: %s did not return within %v", ErrLiveness, what, d)) })
	fn()
	t.Stop()
}

// failure is a violation in a run.
type failure struct {
	at    time.Duration
	err   error
	about string // the world, as the Env describes it
}

// class is the violation's class: its text up to the first ':'.
func (f *failure) class() string {
	s := f.err.Error()
	if i := strings.IndexByte(s, ':'); i > 0 {
		return s[:i]
	}
	return s
}

// Run runs spec.Seeds plus spec.Count random seeds (more with
// THROTTLE_SIM_SEEDS=N; exactly one with THROTTLE_SIM_SEED=S; a tenth of
// them under the race detector), each as a subtest "seed=S" inside its own
// synctest bubble: it builds the world, applies the schedule in time
// order, checks every Sample and after every event, and fails at the
// first violation with the seed, the virtual time, the violation, the
// minimal schedule the shrinker finds for the first failing seed
// (re-runs with events removed and the run cut short, while it still
// fails with a violation of the same class; THROTTLE_SIM_SHRINK=N bounds
// the re-runs, default 60, 0 turns it off) and one replay command. With THROTTLE_SIM_ALL=1 a run goes on after a violation
// and reports the first of each class; with THROTTLE_SIM_CLASS=class it
// looks for violations of that class only. It reports at the end: seeds run,
// simulated time, faults injected per kind, violations per class.
func Run(t *testing.T, spec Spec, build func(env *Env) World) {
	t.Helper()
	if spec.Procs < 1 || spec.Len <= 0 || spec.Sample <= 0 {
		t.Fatalf("faultsim: spec %q needs Procs >= 1, Len > 0 and Sample > 0", spec.Name)
	}
	seeds := seedsToRun(t, spec)
	var st stats
	began := time.Now()
	budget := envInt("THROTTLE_SIM_SHRINK", 60)
	for _, seed := range seeds {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			sched := Generate(spec, seed)
			fs := wanted(runOne(t, spec, sched, stopOn(), build))
			st.add(spec, sched, fs)
			if len(fs) > 0 {
				fail(t, spec, sched, fs, budget, build)
				budget = 0 // the first failing seed only: the others replay
			}
		})
	}
	t.Log(st.report(time.Since(began)))
}

// stopOn returns which violations end a run, by the environment: any
// (the default), none (THROTTLE_SIM_ALL=1), or those of one class
// (THROTTLE_SIM_CLASS=class; the others are ignored).
func stopOn() func(*failure) bool {
	if c := os.Getenv("THROTTLE_SIM_CLASS"); c != "" {
		return func(f *failure) bool { return f.class() == c }
	}
	if os.Getenv("THROTTLE_SIM_ALL") == "1" {
		return func(*failure) bool { return false }
	}
	return anyFailure
}

// wanted keeps of fs the violations of the class THROTTLE_SIM_CLASS names,
// all of them without it.
func wanted(fs []*failure) []*failure {
	if c := os.Getenv("THROTTLE_SIM_CLASS"); c != "" {
		return slices.DeleteFunc(fs, func(f *failure) bool { return f.class() != c })
	}
	return fs
}

// fail shrinks the failing schedule to its first violation in at most
// budget re-runs and fails t with the report.
func fail(t *testing.T, spec Spec, sched Schedule, fs []*failure, budget int, build func(*Env) World) {
	t.Helper()
	f := fs[0]
	msg := fmt.Sprintf("seed %d (%s): violation at %v: %v", sched.Seed, f.about, f.at, f.err)
	for _, g := range fs[1:] {
		msg += fmt.Sprintf("\nalso at %v: %v", g.at, g.err)
	}
	msg += fmt.Sprintf("\nschedule: %v", sched)
	if budget > 0 {
		m, mf, runs := Shrink(t, spec, sched, f, budget, build)
		msg += fmt.Sprintf("\nminimal schedule (%d re-runs): %v\n\tfails at %v: %v", runs, m, mf.at, mf.err)
	}
	msg += fmt.Sprintf("\nreplay: THROTTLE_SIM_SEED=%d go test ./%s -run '^TestSim%s$' -count=1 -v", sched.Seed, pkgPath(), spec.Name)
	t.Fatal(msg)
}

// seedsToRun returns the seeds of a run of spec, by the environment.
func seedsToRun(t *testing.T, spec Spec) []uint64 {
	if s := os.Getenv("THROTTLE_SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("faultsim: THROTTLE_SIM_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	fixed, count := spec.Seeds, spec.Count
	if n := envInt("THROTTLE_SIM_SEEDS", -1); n >= 0 {
		count = n
	} else if raceEnabled {
		fixed, count = nil, (count+9)/10
		for i := 0; i < len(spec.Seeds); i += 10 {
			fixed = append(fixed, spec.Seeds[i])
		}
	}
	base := uint64(time.Now().UnixNano())
	if count > 0 {
		t.Logf("faultsim: %d random seeds drawn from %d", count, base)
	}
	seeds := slices.Clone(fixed)
	for i := range count {
		seeds = append(seeds, splitmix(base+uint64(i)))
	}
	return seeds
}

func envInt(name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return def
	}
	return n
}

// pkgPath returns the test's package directory relative to the workspace
// (or module) root, for the replay command.
func pkgPath() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	root := ""
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			root = dir
			break
		}
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && root == "" {
			root = dir
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	rel, err := filepath.Rel(root, wd)
	if root == "" || err != nil {
		return "."
	}
	return filepath.ToSlash(rel)
}

// Replay runs one given schedule (a shrunk one kept as a regression test,
// or one written by hand) as Run runs a seed, and fails t at its first
// violation, without shrinking.
func Replay(t *testing.T, spec Spec, sched Schedule, build func(env *Env) World) {
	t.Helper()
	fs := wanted(runOne(t, spec, sched, stopOn(), build))
	if len(fs) > 0 {
		msg := fmt.Sprintf("schedule %v\n(%s) violation at %v: %v", sched, fs[0].about, fs[0].at, fs[0].err)
		for _, g := range fs[1:] {
			msg += fmt.Sprintf("\nalso at %v: %v", g.at, g.err)
		}
		t.Fatal(msg)
	}
}
