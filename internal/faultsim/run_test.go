package faultsim

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// planted is a World that fails 100ms after process 3 crashed; the other
// faults do not matter.
type planted struct {
	env     *Env
	crashed time.Duration
	log     []string
}

func (p *planted) Apply(e Event) {
	p.log = append(p.log, fmt.Sprintf("%v apply %v", p.env.Elapsed(), e))
	if e.Kind == Crash && e.From == 3 && p.crashed < 0 {
		p.crashed = p.env.Elapsed()
	}
}

func (p *planted) End(e Event) { p.log = append(p.log, fmt.Sprintf("%v end %v", p.env.Elapsed(), e)) }

func (p *planted) Check(now time.Duration) error {
	if p.crashed >= 0 && now >= p.crashed+100*time.Millisecond {
		return errors.New("planted: process 3 crashed")
	}
	return nil
}

func (p *planted) Close() {}

func buildPlanted(env *Env) World { return &planted{env: env, crashed: -1} }

// TestShrinkToCulprit plants a failure caused by one event among many and
// checks that the shrinker finds that event alone and cuts the run short.
func TestShrinkToCulprit(t *testing.T) {
	spec := testSpec
	spec.Kinds = []Kind{Pause, Crash, ClockStep, Skew, Config}
	var sched Schedule
	for seed := uint64(0); ; seed++ {
		sched = Generate(spec, seed)
		i := slices.IndexFunc(sched.Events, func(e Event) bool { return e.Kind == Crash && e.From == 3 })
		if len(sched.Events) >= 8 && i >= 0 && i < len(sched.Events)-2 {
			break
		}
	}
	f := first(runOne(t, spec, sched, anyFailure, buildPlanted))
	if f == nil {
		t.Fatalf("planted failure not found in %v", sched)
	}
	m, mf, runs := Shrink(t, spec, sched, f, 100, buildPlanted)
	culprit := sched.Events[slices.IndexFunc(sched.Events, func(e Event) bool { return e.Kind == Crash && e.From == 3 })]
	if len(m.Events) != 1 || !sameEvent(m.Events[0], culprit) {
		t.Fatalf("shrunk %d events to %v, want only %v", len(sched.Events), m, culprit)
	}
	if m.Len <= 0 || m.Len > culprit.At+time.Second {
		t.Fatalf("run not cut short: Len %v, culprit at %v", m.Len, culprit.At)
	}
	t.Logf("%d events → %v in %d re-runs; fails at %v: %v", len(sched.Events), m, runs, mf.at, mf.err)
}

// TestReplay checks that a seed replays the same schedule, applied at the
// same virtual times.
func TestReplay(t *testing.T) {
	spec := testSpec
	spec.Kinds = []Kind{Pause, Crash, ClockStep, Skew, Config, Loss}
	run := func(seed uint64) []string {
		var w *planted
		runOne(t, spec, Generate(spec, seed), anyFailure, func(env *Env) World {
			w = &planted{env: env, crashed: 1 << 62}
			return w
		})
		return w.log
	}
	for seed := range uint64(5) {
		a, b := run(seed), run(seed)
		if !slices.Equal(a, b) {
			t.Fatalf("seed %d: two runs applied\n%v\n%v", seed, a, b)
		}
	}
}

// blocking is a World whose Check blocks forever from 1s on, or whose
// Close leaves a goroutine blocked.
type blocking struct{ leak bool }

func (b blocking) Apply(Event) {}
func (b blocking) End(Event)   {}
func (b blocking) Check(now time.Duration) error {
	if !b.leak && now >= time.Second {
		select {}
	}
	return nil
}
func (b blocking) Close() {
	if b.leak {
		go func() { select {} }()
	}
}

func TestDeadlockIsViolation(t *testing.T) {
	spec := Spec{Name: "Dead", Procs: 1, Len: 3 * time.Second, Sample: 100 * time.Millisecond, Kinds: []Kind{Config}, MaxEvents: 1}
	for _, leak := range []bool{false, true} {
		f := first(runOne(t, spec, Generate(spec, 1), anyFailure, func(*Env) World { return blocking{leak: leak} }))
		if f == nil || !errors.Is(f.err, ErrDeadlock) {
			t.Fatalf("leak %v: got %v, want a deadlock", leak, f)
		}
	}
}

// slow is a World one of whose calls takes 2s where 1s is stated.
type slow struct{ env *Env }

func (s slow) Apply(Event) {}
func (s slow) End(Event)   {}
func (s slow) Check(now time.Duration) error {
	if now == 500*time.Millisecond {
		go s.env.Within("the slow call", time.Second, func() { time.Sleep(2 * time.Second) })
	}
	return nil
}
func (s slow) Close() {}

func TestLivenessIsViolation(t *testing.T) {
	spec := Spec{Name: "Slow", Procs: 1, Len: 5 * time.Second, Sample: 100 * time.Millisecond, Kinds: []Kind{Config}, MaxEvents: 1}
	f := first(runOne(t, spec, Generate(spec, 1), anyFailure, func(env *Env) World { return slow{env} }))
	if f == nil || !errors.Is(f.err, ErrLiveness) || f.at < 1500*time.Millisecond || f.at > 1600*time.Millisecond {
		t.Fatalf("got %+v, want a liveness violation at 1.5s", f)
	}
}

// TestRunPasses runs a World without violations through Run.
func TestRunPasses(t *testing.T) {
	spec := testSpec
	spec.Seeds, spec.Count = []uint64{1, 2, 3}, 5
	Run(t, spec, func(env *Env) World { return &planted{env: env, crashed: 1 << 62} })
}
