// Package faultsim runs a component's real code under deterministic fault
// simulation: a schedule of faults drawn from a seed (message loss,
// duplication, delay and spikes per link; two-way, one-way, three-way and
// flapping partitions; pauses; crash-restarts with state lost; clock steps
// and skew; configuration changes) is applied on virtual time
// (testing/synctest) to the processes of a World, whose invariant, sampled
// from the clients' side, is checked at every Sample and after every
// fault. A failing seed prints one replay command and a schedule shrunk to
// the fewest faults that still fail.
//
// Each component writes its World next to its code, in a test file, and
// calls Run from a test named TestSim<Name>.
package faultsim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a fault class.
type Kind uint8

const (
	Loss      Kind = iota // link From→To drops each message with probability P, for Dur
	Duplicate             // link From→To delivers each message twice with probability P, for Dur
	Delay                 // link From→To adds a uniform delay in [0, D) (reorders), for Dur
	Spike                 // every link of node From gets D more delay, for Dur
	Cut                   // two-way partition into Groups (2 groups), for Dur
	OneWay                // messages From→To dropped, To→From delivered, for Dur
	Split3                // partition into three Groups, for Dur
	Flap                  // Cut into Groups that toggles every D, for Dur
	Pause                 // process From stops (no timers, no messages handled) for Dur, resumes with its state
	Crash                 // process From crashes, restarts after Dur with its memory lost (same id, new incarnation)
	ClockStep             // process From's clock jumps by D (may be negative)
	Skew                  // process From's clock runs at rate 1+P (P in ±0.05) from now on
	Config                // component-defined configuration change; Value is a random parameter
	NumKinds
)

var kindNames = [NumKinds]string{"Loss", "Duplicate", "Delay", "Spike", "Cut", "OneWay", "Split3", "Flap",
	"Pause", "Crash", "ClockStep", "Skew", "Config"}

func (k Kind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// AllKinds returns every fault kind, for a Spec whose component supports
// them all.
func AllKinds() []Kind {
	ks := make([]Kind, NumKinds)
	for i := range ks {
		ks[i] = Kind(i)
	}
	return ks
}

// Link reports whether k is a fault of links, applied by Net alone.
func (k Kind) Link() bool { return k <= Flap }

// Lasting reports whether a fault of kind k ends after its Dur (every kind
// but ClockStep, Skew and Config, which are changes from then on).
func (k Kind) Lasting() bool { return k <= Crash }

// Event is one fault of a schedule.
type Event struct {
	At     time.Duration // since the start of the run
	Kind   Kind
	From   int     // process index (or the link's sender); -1 = every process where that makes sense
	To     int     // the link's receiver, for link faults
	Groups [][]int // partitions
	Dur    time.Duration
	D      time.Duration
	P      float64
	Value  uint64
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v@%v", e.Kind, e.At)
	switch e.Kind {
	case Loss, Duplicate, Delay, OneWay:
		fmt.Fprintf(&b, " %d→%d", e.From, e.To)
	case Cut, Split3, Flap:
		fmt.Fprintf(&b, " %v", e.Groups)
	default:
		fmt.Fprintf(&b, " proc %d", e.From)
	}
	if e.Kind.Lasting() {
		fmt.Fprintf(&b, " for %v", e.Dur)
	}
	switch e.Kind {
	case Loss, Duplicate, Skew:
		fmt.Fprintf(&b, " p=%.3f", e.P)
	case Delay, Spike, Flap, ClockStep:
		fmt.Fprintf(&b, " d=%v", e.D)
	case Config:
		fmt.Fprintf(&b, " value=%d", e.Value)
	}
	return b.String()
}

// Load is the load shape the component drives.
type Load uint8

const (
	Steady Load = iota
	Bursty
	NewKeys
	HotKey
	NumLoads
)

func (l Load) String() string {
	return [...]string{"Steady", "Bursty", "NewKeys", "HotKey", "Load(4)"}[min(l, NumLoads)]
}

// Schedule is what one seed runs: the load and the faults.
type Schedule struct {
	Seed   uint64
	Kinds  []Kind // the kinds this seed enabled (swarm testing: a random subset of Spec.Kinds)
	Load   Load
	Events []Event // sorted by At
	// Len cuts the run short when > 0 (the shrinker sets it); else the
	// run lasts Spec.Len.
	Len time.Duration
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, load %v, kinds %v, %d faults", s.Seed, s.Load, s.Kinds, len(s.Events))
	if s.Len > 0 {
		fmt.Fprintf(&b, ", run cut at %v", s.Len)
	}
	for _, e := range s.Events {
		b.WriteString("\n\t")
		b.WriteString(e.String())
	}
	return b.String()
}

// Spec describes a component's simulation.
type Spec struct {
	Name      string        // component name, used in the replay command
	Procs     int           // processes subject to faults, indices 0..Procs-1 (roles are the component's)
	Len       time.Duration // simulated length of one run
	Sample    time.Duration // how often Check runs
	Kinds     []Kind        // the fault kinds the component supports
	MaxEvents int
	Seeds     []uint64 // the fixed seeds run on every `go test` (seeds that found defects stay here)
	Count     int      // random seeds added to the fixed ones in a normal run
	// Latency is every link's one-way delay before faults (default 1ms).
	Latency time.Duration
	// Hot lists processes that get half of the process faults (the
	// servers, say); nil: all alike.
	Hot []int
}

// Generate draws the schedule of seed for spec. It is deterministic: the
// same spec and seed give the same schedule. It enables a random non-empty
// subset of spec.Kinds, picks a load, and draws 1..MaxEvents faults of the
// enabled kinds, their times in the first 80% of the run and their
// parameters scaled to Len (durations log-uniform in [Len/400, Len/4)). The process-level downtimes (Pause, Crash) of
// one process never overlap.
func Generate(spec Spec, seed uint64) Schedule {
	r := rand.New(rand.NewPCG(seed, 0x5eed_fa17_5140_0001))
	s := Schedule{Seed: seed, Load: Load(r.IntN(int(NumLoads)))}
	for _, k := range spec.Kinds {
		if r.IntN(2) == 0 && usable(k, spec.Procs) {
			s.Kinds = append(s.Kinds, k)
		}
	}
	if len(s.Kinds) == 0 {
		var ok []Kind
		for _, k := range spec.Kinds {
			if usable(k, spec.Procs) {
				ok = append(ok, k)
			}
		}
		if len(ok) == 0 {
			return s
		}
		s.Kinds = []Kind{ok[r.IntN(len(ok))]}
	}
	n := 1 + r.IntN(max(spec.MaxEvents, 1))
	busy := make(map[int][][2]time.Duration)
	for range n {
		e := draw(r, spec, s.Kinds[r.IntN(len(s.Kinds))])
		if e.Kind == Pause || e.Kind == Crash {
			if overlaps(busy[e.From], e.At, e.At+e.Dur) {
				continue
			}
			busy[e.From] = append(busy[e.From], [2]time.Duration{e.At, e.At + e.Dur})
		}
		s.Events = append(s.Events, e)
	}
	slices.SortStableFunc(s.Events, func(a, b Event) int { return int(a.At - b.At) })
	return s
}

// usable reports whether faults of kind k can be drawn among procs
// processes.
func usable(k Kind, procs int) bool {
	switch {
	case k >= NumKinds || procs < 1:
		return false
	case k == Split3:
		return procs >= 3
	case k.Link():
		return procs >= 2 || k == Spike
	}
	return true
}

func overlaps(spans [][2]time.Duration, from, to time.Duration) bool {
	for _, s := range spans {
		if from < s[1] && s[0] < to {
			return true
		}
	}
	return false
}

// between draws a duration uniformly in [lo, hi).
func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

// logBetween draws a duration in [lo, hi) whose logarithm is uniform:
// short faults as often as long ones, in proportion.
func logBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if lo <= 0 || hi <= lo {
		return between(r, lo, hi)
	}
	return time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), r.Float64()))
}

// draw draws one fault of kind k.
func draw(r *rand.Rand, spec Spec, k Kind) Event {
	l := spec.Len
	e := Event{Kind: k, At: between(r, 0, l*8/10), From: proc(r, spec), To: -1}
	if k.Link() && k != Spike {
		e.To = r.IntN(spec.Procs - 1)
		if e.To >= e.From {
			e.To++
		}
	}
	if k.Lasting() {
		e.Dur = logBetween(r, l/400, l/4)
	}
	switch k {
	case Loss, Duplicate:
		e.P = 0.05 + 0.95*r.Float64()
	case Delay:
		e.D = between(r, time.Millisecond, max(l/30, 2*time.Millisecond))
	case Spike:
		e.D = between(r, l/100, max(l/10, l/100+1))
	case Cut:
		e.Groups = groups(r, spec.Procs, 2)
	case Split3:
		e.Groups = groups(r, spec.Procs, 3)
	case Flap:
		e.Groups = groups(r, spec.Procs, 2)
		e.D = between(r, l/200+time.Millisecond, max(l/20, l/200+2*time.Millisecond))
	case ClockStep:
		e.D = between(r, -l/10, l/10)
	case Skew:
		e.P = -0.05 + 0.1*r.Float64()
	case Config:
		e.Value = r.Uint64()
	}
	return e
}

// proc draws a process, one of spec.Hot half of the time when it names
// some.
func proc(r *rand.Rand, spec Spec) int {
	if len(spec.Hot) > 0 && r.IntN(2) == 0 {
		return spec.Hot[r.IntN(len(spec.Hot))]
	}
	return r.IntN(spec.Procs)
}

// groups splits 0..procs-1 into n non-empty groups at random.
func groups(r *rand.Rand, procs, n int) [][]int {
	perm := r.Perm(procs)
	cuts := r.Perm(procs - 1)[:n-1] // n-1 distinct cut points in 1..procs-1
	slices.Sort(cuts)
	gs := make([][]int, 0, n)
	prev := 0
	for _, c := range cuts {
		gs = append(gs, slices.Sorted(slices.Values(perm[prev:c+1])))
		prev = c + 1
	}
	return append(gs, slices.Sorted(slices.Values(perm[prev:])))
}

// Range returns the n seeds from, from+1, …: a block of fixed seeds for
// Spec.Seeds.
func Range(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}
