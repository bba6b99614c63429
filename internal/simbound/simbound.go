// Package simbound writes down, once, the per-key bounds that the gossip
// and daemon fault simulations assert, as functions of the configuration
// (N members, rate, burst) and of the faults of a schedule that overlap
// the window checked; and a Series that checks every window between two
// samples of what the clients were admitted against such a bound.
//
// The bounds are those the issue tracker and the docs state must hold:
// one exact bucket per key, plus, while faults make members decide alone,
// fallback buckets of rate/N and burst/N on at most N-1 of them; no fresh
// burst when a process restarts or a key moves.
package simbound

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttle/internal/faultsim"
)

// Params is the configuration a bound depends on.
type Params struct {
	N     int     // configured members
	Rate  float64 // tokens per second
	Burst int
	// Lag is how late a member learns of another's hits while no fault
	// delays them: an interval plus the delivery delay (all-to-all).
	Lag time.Duration
}

// FallbackBurst is the burst of a fallback bucket: burst/N, at least 1.
func (p Params) FallbackBurst() float64 { return float64(max(1, p.Burst/max(p.N, 1))) }

// Episode is one fault of a schedule as a bound sees it: the time it may
// make members decide without each other, from its start to its end plus
// the time the component takes to settle after it.
type Episode struct {
	Kind     faultsim.Kind
	From, To time.Duration
	Count    int // fallback episodes it stands for (a flapping cut: one per cut)
	Restart  bool
}

// Start is the kind of the episode a component adds for its start, while
// its members have not heard each other yet.
const Start = faultsim.NumKinds

// Reload is the kind of the episode a limit change adds to the new limit's
// bound, from the first member that applies it until every running member
// has (and a settle after): meanwhile members ask owners that do not have
// the new limit yet, or report hits to members that drop them.
const Reload = faultsim.NumKinds + 1

// RateChange reports whether e is a change of the limit (its rate and
// burst, on every member one after the other, as a rules reload pushed to
// each) rather than of the peers: a Config event with its Value's top bit
// set, for the components that simulate both (gossip). Others take every
// Config event for a change of peers (ConfigPair).
func RateChange(e faultsim.Event) bool { return e.Kind == faultsim.Config && e.Value>>63 == 1 }

// PeerChanges returns sched without its rate changes (RateChange).
func PeerChanges(sched faultsim.Schedule) faultsim.Schedule {
	out := sched
	out.Events = slices.DeleteFunc(slices.Clone(sched.Events), RateChange)
	return out
}

// Episodes returns the episodes of sched's faults that start by length,
// each lasting settle more than the fault; clock steps and skew last to
// the end of the run (clocks do not agree again). Duplicates are left
// out: no component decides differently on a duplicate.
func Episodes(sched faultsim.Schedule, length, settle time.Duration) []Episode {
	var eps []Episode
	for _, e := range sched.Events {
		if e.At > length || e.Kind == faultsim.Duplicate || e.Kind == faultsim.Config {
			continue
		}
		ep := Episode{Kind: e.Kind, From: e.At, To: e.At + e.Dur + settle, Count: 1, Restart: e.Kind == faultsim.Crash}
		switch e.Kind {
		case faultsim.ClockStep, faultsim.Skew:
			ep.To = length + settle
		case faultsim.Flap:
			ep.Count = int(e.Dur/max(e.D, time.Millisecond))/2 + 1
		}
		eps = append(eps, ep)
	}
	return eps
}

// ConfigPair is the change a Config event makes among n members: member
// u leaves member v out of its peers, or takes it back if it left it
// out.
func ConfigPair(e faultsim.Event, n int) (u, v int) {
	u = int(e.Value % uint64(n))
	v = (u + 1 + int(e.Value/uint64(n)%uint64(n-1))) % n
	return u, v
}

// ConfigEpisodes returns the episodes of sched's Config events among n
// members: from a member left out of another's peers (ConfigPair) until
// it is taken back, or the one that left it out restarts (with its full
// configuration), or the run ends; each settle longer.
func ConfigEpisodes(sched faultsim.Schedule, n int, length, settle time.Duration) []Episode {
	if n < 2 {
		return nil
	}
	out := map[[2]int]time.Duration{} // left out since
	var eps []Episode
	end := func(pair [2]int, at time.Duration) {
		eps = append(eps, Episode{Kind: faultsim.Config, From: out[pair], To: at + settle, Count: 1})
		delete(out, pair)
	}
	for _, st := range stepsOf(sched, length) {
		switch e := st.e; {
		case e.Kind == faultsim.Config && !st.end:
			u, v := ConfigPair(e, n)
			if _, ok := out[[2]int{u, v}]; ok {
				end([2]int{u, v}, e.At)
			} else {
				out[[2]int{u, v}] = e.At
			}
		case e.Kind == faultsim.Crash && st.end:
			for pair := range out {
				if pair[0] == e.From {
					end(pair, st.at)
				}
			}
		}
	}
	for pair := range out {
		end(pair, length)
	}
	slices.SortFunc(eps, func(a, b Episode) int { return int(a.From - b.From) })
	return eps
}

type step struct {
	at  time.Duration
	end bool
	e   faultsim.Event
}

// stepsOf lists the starts of sched's events and the ends of its crashes
// up to length, in time order.
func stepsOf(sched faultsim.Schedule, length time.Duration) []step {
	var out []step
	for _, e := range sched.Events {
		if e.At <= length {
			out = append(out, step{at: e.At, e: e})
		}
		if e.Kind == faultsim.Crash && e.At+e.Dur <= length {
			out = append(out, step{at: e.At + e.Dur, end: true, e: e})
		}
	}
	slices.SortStableFunc(out, func(a, b step) int { return int(a.at - b.at) })
	return out
}

// Window is what a bound knows of the window [t0, t] it bounds.
type Window struct {
	T0, T    time.Duration // the window, since the start of the run
	D        time.Duration // t - t0
	DC       time.Duration // the most any member's clock advanced over it (steps and skew), at least D
	Overlap  time.Duration // of the window with the union of the episodes
	Episodes int           // episodes overlapping it (Episode.Count each)
	// Since counts the episodes that started before its end, overlapping
	// it or not: a member that took an owner for silent decides its next
	// ask to it on its fallback bucket, however late (its probe), so a
	// fault may cost one fallback burst after it ended.
	Since    int
	Restarts int // crash-restarts overlapping it
	Kinds    []faultsim.Kind
	// Configs counts the configuration episodes overlapping it (a member
	// left out of another's peers), ConfigOverlap their total overlap.
	Configs       int
	ConfigOverlap time.Duration
}

// At returns the window [t0, t] given the episodes and the clock offsets
// of every member at t0 and at t.
func At(eps []Episode, t0, t time.Duration, off0, off []time.Duration) Window {
	w := Window{T0: t0, T: t, D: t - t0, DC: t - t0}
	for i := range off {
		if i < len(off0) {
			w.DC = max(w.DC, t-t0+off[i]-off0[i])
		}
	}
	var spans [][2]time.Duration
	for _, e := range eps {
		if e.From < t && e.Kind != faultsim.Config {
			w.Since += e.Count
		}
		if e.To <= t0 || e.From >= t {
			continue
		}
		if !slices.Contains(w.Kinds, e.Kind) {
			w.Kinds = append(w.Kinds, e.Kind)
		}
		if e.Kind == faultsim.Config {
			w.Configs++
			w.ConfigOverlap += min(e.To, t) - max(e.From, t0)
			continue
		}
		w.Episodes += e.Count
		if e.Restart {
			w.Restarts++
		}
		spans = append(spans, [2]time.Duration{max(e.From, t0), min(e.To, t)})
	}
	slices.SortFunc(spans, func(a, b [2]time.Duration) int { return int(a[0] - b[0]) })
	end := t0
	for _, s := range spans {
		if s[1] > end {
			w.Overlap += s[1] - max(s[0], end)
			end = s[1]
		}
	}
	slices.Sort(w.Kinds)
	return w
}

// Sub returns the part of w from from to to (its bounds kept within w's),
// with the episodes eps, and ok false if they do not overlap: the window a
// limit that was in force from from to to bounds. Its clock advance keeps
// w's excess over real time (DC - D), at most what w's clocks gained.
func Sub(w Window, eps []Episode, from, to time.Duration) (sub Window, ok bool) {
	t0, t := max(w.T0, from), min(w.T, to)
	if t0 >= t {
		return Window{}, false
	}
	sub = At(eps, t0, t, nil, nil)
	sub.DC = sub.D + (w.DC - w.D)
	return sub, true
}

// refill is what rate refills over d.
func (p Params) refill(d time.Duration) float64 { return p.Rate * d.Seconds() }

// fallback is what the fallback buckets of one member may admit in w: one
// bucket of burst/N at rate/N over the window, or burst/N per episode
// begun by then and rate/N while they last, whichever is less.
func (p Params) fallback(w Window) float64 {
	if w.Since == 0 {
		return 0
	}
	fb, n := p.FallbackBurst(), float64(p.N)
	return min(fb+p.refill(w.DC)/n, float64(w.Since)*fb+p.refill(w.Overlap)/n)
}

// Owner is the bound of owner routing (gossip.OwnedLimiter, and the daemon
// with routing "owner") for one key over w: the owner's exact bucket,
// burst + rate x DC; plus, while faults overlap the window, the fallback
// buckets of the N-1 other members (each burst/N + rate/N x the time),
// the owner's own fallback bucket while it sees no majority (its burst/N
// per episode: its rate replaces the exact bucket's), and burst/N for
// each restart's fresh fallback bucket. A restarted owner and a new owner
// after a move add nothing: they must start the key conservatively.
func Owner(p Params, w Window) float64 {
	fb := p.FallbackBurst()
	own := min(float64(w.Episodes)*fb, fb+p.refill(w.DC)/float64(p.N))
	return float64(p.Burst) + p.refill(w.DC) + float64(p.N-1)*p.fallback(w) + own + float64(w.Restarts)*fb + p.configs(w)
}

// configs is what configuration changes overlapping w add: while a member
// is left out of another's peers the two disagree on the members, and a
// key may be decided on one more bucket (burst + rate x the time), as the
// docs state for views that differ.
func (p Params) configs(w Window) float64 {
	return float64(w.Configs*p.Burst) + p.refill(w.ConfigOverlap)
}

// AllToAll is the bound of the all-to-all counters (gossip.Limiter without
// the spend cap) for one key over w: N x burst + rate x DC, plus what the
// other N-1 members admit before they hear of the hits, rate x Lag each,
// and, while faults delay or cut the reports or a member is left out of
// another's peers, rate x the overlap each (and a burst per such change).
func AllToAll(p Params, w Window) float64 {
	n := float64(p.N)
	return n*float64(p.Burst) + p.refill(w.DC) + (n-1)*p.refill(p.Lag+w.Overlap+w.ConfigOverlap) + float64(w.Configs*p.Burst)
}

// Capped is the bound of the all-to-all counters with the spend cap over a
// window that no fault nor configuration change overlaps (every report of the round before the last
// arrived, clocks agree): burst + rate x DC + N-1.
func Capped(p Params, w Window) float64 {
	return float64(p.Burst) + p.refill(w.DC) + float64(p.N-1)
}

// Restart bounds what a member that restarted admits of a key that was
// exhausted (denied) at since, from its restart to now: no fresh burst,
// only burst/N (a conservative start) + 1 + rate x the time since the
// denial (by the member's clock if it ran faster), plus, for the
// all-to-all counters (lag > 0), what the other members admitted that
// it has not heard of yet, rate x lag each.
func Restart(p Params, sinceDenial time.Duration, lag time.Duration) float64 {
	return p.FallbackBurst() + 1 + p.refill(sinceDenial) + float64(p.N-1)*p.refill(lag)
}

type sample struct {
	t      time.Duration
	counts []int64
	off    []time.Duration
}

// Series is the admitted units of some keys sampled over a run, to check
// every window between two samples against a bound. Not safe for
// concurrent use.
type Series struct {
	keys    []string
	samples []sample
	// Extra, if set, is what a window's bound allows one key (by its
	// index in NewSeries) on top of the bound of every key.
	Extra func(w Window, key int) float64
}

// NewSeries returns an empty series of keys.
func NewSeries(keys []string) *Series { return &Series{keys: keys} }

// Add records the cumulative admitted units of every key (in the order
// of NewSeries) and the members' clock offsets at t, and checks every
// window ending at t against bound: it returns an error of class name
// (the text before its first ':') naming the worst key and window and
// the fault kinds overlapping it, nil if none exceeds its bound. A
// window's DC is the most a member's clock read at some instant of it
// beyond what it read at an earlier one: a clock stepped back does not
// take back what it admitted before the step.
func (s *Series) Add(t time.Duration, counts []int64, off []time.Duration, name string, eps []Episode, bound func(Window) float64) error {
	cur := sample{t: t, counts: counts, off: off}
	var worst error
	excess := 0.0
	adv := newAdvance(cur)
	for i := len(s.samples) - 1; i >= 0; i-- {
		p := s.samples[i]
		dc := adv.add(p)
		if p.t >= t {
			continue
		}
		w := At(eps, p.t, t, p.off, off)
		w.DC = max(w.DC, dc)
		all := bound(w)
		for k := range counts {
			b := all
			if s.Extra != nil {
				b += s.Extra(w, k)
			}
			if got := float64(counts[k] - p.counts[k]); got-b > excess {
				excess = got - b
				worst = fmt.Errorf("%s: under %s key %q admitted %.0f in [%v, %v], bound %.1f (window %v, clock %v, faults for %v, %d episodes, %d restarts)",
					name, kinds(w.Kinds), s.keys[k], got, p.t, t, b, w.D, w.DC, w.Overlap, w.Episodes, w.Restarts)
			}
		}
	}
	s.samples = append(s.samples, cur)
	return worst
}

// maxSkew is the most a faultsim clock's rate differs from 1.
const maxSkew = 0.05

// advance folds samples, latest first, into the most each member's clock
// read at one of them (or between two: up to (1+maxSkew) times the gap
// past the earlier, for a clock stepped back between them) beyond what
// it read at an earlier one.
type advance struct {
	next sample          // the sample folded last (the earliest so far)
	peak []time.Duration // per member, the most its clock read since
	best time.Duration
}

func newAdvance(cur sample) *advance {
	a := &advance{next: cur, peak: make([]time.Duration, len(cur.off))}
	for i, o := range cur.off {
		a.peak[i] = cur.t + o
	}
	return a
}

// add folds p, earlier than every sample folded so far, and returns the
// advance over the window from p on.
func (a *advance) add(p sample) time.Duration {
	gap := time.Duration(float64(a.next.t-p.t) * (1 + maxSkew))
	for i := range min(len(p.off), len(a.peak)) {
		read := p.t + p.off[i]
		a.peak[i] = max(a.peak[i], read+gap, read)
		a.best = max(a.best, a.peak[i]-read)
	}
	a.next = p
	return a.best
}

func kinds(ks []faultsim.Kind) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, k := range ks {
		if i > 0 {
			b.WriteByte(',')
		}
		switch k {
		case Start:
			b.WriteString("Start")
		case Reload:
			b.WriteString("Reload")
		default:
			b.WriteString(k.String())
		}
	}
	b.WriteByte(']')
	return b.String()
}

// Offsets returns how far each clock is ahead of virtual time now, for
// Series.Add.
func Offsets(clocks []*faultsim.Clock) []time.Duration {
	off := make([]time.Duration, len(clocks))
	for i, c := range clocks {
		off[i] = c.Offset()
	}
	return off
}

// Host is a process of a simulation that pauses, crashes (its state
// lost) and restarts.
type Host interface {
	SetPaused(paused bool)
	Crash()
	Restart()
}

// Fault applies the start (end false) or the end of a Pause or Crash of
// e.From among hosts; other kinds are left to the caller.
func Fault[H Host](hosts []H, e faultsim.Event, end bool) {
	if e.From < 0 || e.From >= len(hosts) {
		return
	}
	h := hosts[e.From]
	switch {
	case e.Kind == faultsim.Pause:
		h.SetPaused(!end)
	case e.Kind == faultsim.Crash && !end:
		h.Crash()
	case e.Kind == faultsim.Crash:
		h.Restart()
	}
}

// Run is what a component's world shares with the bounds: the episodes
// of its schedule (each settle longer than its fault, plus the start,
// while the members have not heard each other: start long) and the keys
// its load asks.
type Run struct {
	Eps    []Episode
	Keys   []string
	KeyIdx map[string]int
}

// NewRun returns the run of env's schedule cut at its length.
func NewRun(env *faultsim.Env, settle, start time.Duration) Run {
	return NewRunOf(env, env.Sched, settle, start)
}

// NewRunOf is NewRun of sched, env's schedule or a part of it: less the
// events that the component bounds itself (see PeerChanges).
func NewRunOf(env *faultsim.Env, sched faultsim.Schedule, settle, start time.Duration) Run {
	length := env.Spec.Len
	if sched.Len > 0 {
		length = min(length, sched.Len)
	}
	eps := append(Episodes(sched, length, settle), ConfigEpisodes(sched, env.Spec.Procs, length, settle)...)
	r := Run{Eps: append(eps, Episode{Kind: Start, To: start, Count: 1}),
		Keys: Keys(sched.Load, env.Spec.Len), KeyIdx: map[string]int{}}
	for i, k := range r.Keys {
		r.KeyIdx[k] = i
	}
	return r
}
