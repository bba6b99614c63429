package faultsim

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// ErrDeadlock is the class of a run whose goroutines all blocked, or that
// left goroutines blocked after Close.
var ErrDeadlock = errors.New("deadlock")

// closeWait bounds World.Close, in virtual time.
const closeWait = 10 * time.Minute

// runOne runs sched in a synctest bubble, ending it at the first
// violation that stop accepts, and returns the first violation of each
// class it saw, in order.
func runOne(t *testing.T, spec Spec, sched Schedule, stop func(*failure) bool, build func(*Env) World) (fs []*failure) {
	defer func() {
		if r := recover(); r != nil {
			if !strings.Contains(fmt.Sprint(r), "deadlock") {
				panic(r)
			}
			fs = append(fs, &failure{at: -1, err: fmt.Errorf("%w: %v", ErrDeadlock, r)})
		}
	}()
	synctest.Test(t, func(t *testing.T) { fs = drive(t, spec, sched, stop, build) })
	return fs
}

// anyFailure ends a run at its first violation.
func anyFailure(*failure) bool { return true }

// first returns the first of fs, nil if none.
func first(fs []*failure) *failure {
	if len(fs) == 0 {
		return nil
	}
	return fs[0]
}

// step is a fault starting or ending at a time of the run.
type step struct {
	at  time.Duration
	end bool
	e   Event
}

// steps lists the starts and the ends (of lasting faults) of sched's
// events up to length, in time order, an end before a start at the same
// time.
func steps(sched Schedule, length time.Duration) []step {
	var out []step
	for _, e := range sched.Events {
		if e.At > length {
			continue
		}
		out = append(out, step{at: e.At, e: e})
		if e.Kind.Lasting() && e.At+e.Dur <= length {
			out = append(out, step{at: e.At + e.Dur, end: true, e: e})
		}
	}
	slices.SortStableFunc(out, func(a, b step) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if a.end != b.end {
			if a.end {
				return -1
			}
			return 1
		}
		return 0
	})
	return out
}

// drive builds the world and runs sched on it; it runs inside the bubble.
func drive(t *testing.T, spec Spec, sched Schedule, stop func(*failure) bool, build func(*Env) World) []*failure {
	lat := spec.Latency
	if lat == 0 {
		lat = time.Millisecond
	}
	env := &Env{T: t, Spec: spec, Sched: sched, start: time.Now(), stop: stop,
		Net: NewNet(sched.Seed, spec.Procs, lat), Rand: rand.New(rand.NewPCG(sched.Seed, 0x10ad))}
	for range spec.Procs {
		env.Clocks = append(env.Clocks, NewClock())
	}
	w := build(env)
	length := spec.Len
	if sched.Len > 0 {
		length = min(length, sched.Len)
	}
	play(env, w, steps(sched, length), length)
	closeWorld(env, w)
	env.Net.Close()
	return env.violations()
}

// play applies the steps and samples the world until length, returning
// the first violation.
func play(env *Env, w World, todo []step, length time.Duration) *failure {
	sample := env.Spec.Sample
	for {
		next, isStep := sample, false
		if len(todo) > 0 && todo[0].at <= sample {
			next, isStep = todo[0].at, true
		}
		if next > length {
			return env.violation()
		}
		time.Sleep(time.Until(env.start.Add(next)))
		if isStep {
			apply(env, w, todo[0])
			todo = todo[1:]
		} else {
			sample += env.Spec.Sample
		}
		if err := w.Check(next); err != nil {
			env.Violate(err)
		}
		if f := env.violation(); f != nil {
			return f
		}
	}
}

// apply starts or ends a fault.
func apply(env *Env, w World, s step) {
	e := s.e
	switch {
	case e.Kind.Link() && !s.end:
		env.Net.Start(e)
	case e.Kind.Link():
		env.Net.End(e)
	case (e.Kind == Pause || e.Kind == Crash) && !s.end:
		env.Net.SetUp(e.From, false)
		w.Apply(e)
	case e.Kind == Pause || e.Kind == Crash:
		env.Net.SetUp(e.From, true)
		w.End(e)
	default:
		for i, c := range env.Clocks {
			if e.From == i || e.From == -1 {
				switch e.Kind {
				case ClockStep:
					c.Step(e.D)
				case Skew:
					c.SetSkew(e.P)
				}
			}
		}
		w.Apply(e)
	}
}

// closeWorld closes w, a violation when Close does not return within
// closeWait.
func closeWorld(env *Env, w World) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Close()
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		env.Violate(fmt.Errorf("%w: Close did not return within %v", ErrDeadlock, closeWait))
	}
}

// Shrink reduces sched, which failed with f, to a schedule that still
// fails with a violation of f's class with as few events as it finds and
// the run cut short after the failure, in at most budget re-runs. It
// returns that schedule, its failure and the re-runs it took.
func Shrink(t *testing.T, spec Spec, sched Schedule, f *failure, budget int, build func(*Env) World) (Schedule, *failure, int) {
	runs := 0
	class := f.class()
	same := func(g *failure) bool { return g.class() == class }
	try := func(s Schedule) *failure {
		runs++
		fs := runOne(t, spec, s, same, build)
		if i := slices.IndexFunc(fs, same); i >= 0 {
			return fs[i]
		}
		return nil
	}
	cur, cf := sched, f
	cut := func(s Schedule, at time.Duration) Schedule {
		if at >= 0 {
			s.Len = at + spec.Sample
			s.Events = slices.DeleteFunc(slices.Clone(s.Events), func(e Event) bool { return e.At > s.Len })
		}
		return s
	}
	if c := cut(cur, cf.at); c.Len > 0 && c.Len < spec.Len && runs < budget {
		if nf := try(c); nf != nil {
			cur, cf = cut(c, nf.at), nf
		}
	}
	for chunk := max(len(cur.Events)/2, 1); chunk >= 1 && runs < budget; chunk /= 2 {
		for i := 0; i < len(cur.Events) && runs < budget; {
			c := cur
			c.Events = slices.Delete(slices.Clone(cur.Events), i, min(i+chunk, len(cur.Events)))
			if nf := try(c); nf != nil {
				cur, cf = cut(c, nf.at), nf
				continue
			}
			i += chunk
		}
	}
	return cur, cf, runs
}

// stats counts what a Run explored.
type stats struct {
	mu         sync.Mutex
	seeds      int
	simulated  time.Duration
	faults     [NumKinds]int
	loads      [NumLoads]int
	violations map[string]int
	failed     []uint64
}

func (s *stats) add(spec Spec, sched Schedule, fs []*failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seeds++
	s.simulated += spec.Len
	s.loads[sched.Load%NumLoads]++
	for _, e := range sched.Events {
		s.faults[e.Kind%NumKinds]++
	}
	if len(fs) == 0 {
		return
	}
	if s.violations == nil {
		s.violations = map[string]int{}
	}
	for _, f := range fs {
		s.violations[f.class()]++
	}
	s.failed = append(s.failed, sched.Seed)
}

func (s *stats) report(took time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "faultsim: %d seeds in %v, %v simulated; faults:", s.seeds, took.Round(time.Millisecond), s.simulated)
	for k, n := range s.faults {
		if n > 0 {
			fmt.Fprintf(&b, " %v=%d", Kind(k), n)
		}
	}
	fmt.Fprintf(&b, "; loads: %v; seeds with violations: %d; by class:", s.loads, len(s.failed))
	for _, c := range slices.Sorted(maps.Keys(s.violations)) {
		fmt.Fprintf(&b, " %s=%d", c, s.violations[c])
	}
	if len(s.failed) > 0 {
		fmt.Fprintf(&b, "; failing seeds: %v", s.failed)
	}
	return b.String()
}
