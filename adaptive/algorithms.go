package adaptive

import (
	"math"
	"time"
)

var (
	_ Algorithm = (*AIMD)(nil)
	_ Algorithm = (*Vegas)(nil)
	_ Algorithm = (*Gradient2)(nil)
)

// appLimited reports whether the load did not test the limit: fewer than
// half its units were ever in flight, so latency says nothing about it.
func appLimited(limit float64, w Window) bool { return float64(w.MaxInFlight)*2 < limit }

// AIMD is loss-based: it adds one to the limit per limit's worth of
// successes (about one per round trip, as TCP's congestion avoidance
// does) and multiplies it by Backoff on a window with a loss. A loss is a
// drop (a Dropped outcome, or a success slower than Config.Timeout) or,
// by default, a window whose mean RTT is above RTTFactor times the
// backend's RTT without a queue: the least such mean seen, over windows
// that did not test the limit or, failing those, over all windows, reset
// every Probe windows. So it needs no timeout tuned to the backend. Use
// one AIMD per Limiter (it keeps that RTT); the zero value is the
// defaults.
type AIMD struct {
	// Backoff is the factor applied on a loss, in (0, 1); default 0.9.
	Backoff float64
	// RTTFactor is how many times the RTT without a queue a window's
	// mean RTT may reach before it counts as a loss; default 2, negative
	// turns the signal off (drops alone count).
	RTTFactor float64
	// Probe is how many windows pass between resets of the RTT without a
	// queue (see Vegas.Probe); default 1000, negative never.
	Probe int

	rtt noLoad
}

// Update implements Algorithm.
func (a *AIMD) Update(limit float64, w Window) float64 {
	f := a.RTTFactor
	if f == 0 {
		f = 2
	}
	base := a.rtt.update(w, a.Probe)
	if w.Dropped > 0 || f > 0 && base > 0 && float64(w.AvgRTT) > f*float64(base) {
		b := a.Backoff
		if b <= 0 || b >= 1 {
			b = 0.9
		}
		return limit * b
	}
	if appLimited(limit, w) {
		return limit
	}
	return limit + float64(w.Samples)/limit
}

// noLoad estimates the RTT without a queue: the least of a sample-weighted
// average of window mean RTTs (over about noLoadSamples successes, so that
// the noise of one window's mean does not pull it down), reset every
// probe windows (default 1000, negative never).
type noLoad struct {
	avg, least float64 // ns
	short      float64 // ns: the average over about shortSamples successes
	n          int     // successes averaged
	windows    int
	stall      stall
}

// stall notices a rise of the RTT that cutting the limit does not undo:
// not a queue, but a slower path to the backend (a network, a dependency
// of its own). After stallWindows windows in a row whose RTT is high, if
// the requests in flight fell to half of what they were when it began (8
// or more) and the RTT did not fall by a tenth, the RTT without a queue
// is the new one.
type stall struct {
	run int
	rtt float64 // ns, when the run began
	in  int     // in flight when the run began
}

const stallWindows = 10

// rose reports whether a run of windows with a high RTT (high, for w)
// holds a rise that cutting the limit did not undo.
func (s *stall) rose(w Window, high bool) bool {
	if !high {
		s.run = 0
		return false
	}
	if s.run == 0 {
		s.rtt, s.in = float64(w.AvgRTT), w.MaxInFlight
	}
	if s.run++; s.run >= stallWindows && s.in >= 8 && 2*w.MaxInFlight <= s.in && float64(w.AvgRTT) >= 0.9*s.rtt {
		s.run = 0
		return true
	}
	return false
}

// noLoadSamples is how many successes the average spans: the mean of
// 1000 service times of coefficient of variation 1 is within ±6% of
// theirs 95% of the time. shortSamples is the span of the short average Vegas
// compares with it: ±14%, responding within a few windows.
const (
	noLoadSamples = 1000
	shortSamples  = 200
)

func (e *noLoad) update(w Window, probe int) time.Duration {
	if probe == 0 {
		probe = 1000
	}
	if e.windows++; probe > 0 && e.windows%probe == 0 {
		e.least = 0
	}
	if w.AvgRTT <= 0 || w.Samples <= 0 {
		return time.Duration(e.least)
	}
	e.n += w.Samples
	weight := min(1, float64(w.Samples)/float64(min(e.n, noLoadSamples)))
	e.avg += (float64(w.AvgRTT) - e.avg) * weight
	e.short += (float64(w.AvgRTT) - e.short) * min(1, float64(w.Samples)/float64(min(e.n, shortSamples)))
	if e.stall.rose(w, e.least > 0 && float64(w.AvgRTT) > 1.25*e.least) {
		e.least, e.avg, e.short = float64(w.AvgRTT), float64(w.AvgRTT), float64(w.AvgRTT)
	}
	if e.n >= noLoadSamples && (e.least == 0 || e.avg < e.least) {
		e.least = e.avg
	}
	return time.Duration(e.least)
}

// Vegas estimates the requests queued at the backend as
// limit × (1 − RTTnoload / RTT), RTT being an average of window mean RTTs
// over about 200 successes and RTTnoload the least of such an average over about 1000
// successes (not the least single RTT, nor the least window mean: under
// a spread of service times those are far below the mean even with no
// queue, and would hold the limit down). A rise of the RTT that halving
// the requests in flight does not undo (a slower path, not a queue) is
// taken as the new RTTnoload after 10 windows. It
// keeps that queue between alpha = 3·log10(limit) and beta =
// 6·log10(limit): it grows fast while the queue is below log10(limit),
// by log10(limit) while it is below alpha, and shrinks by log10(limit)
// above beta or on a drop. Use one Vegas per Limiter (it keeps the no-load
// RTT); the zero value is the defaults.
type Vegas struct {
	// Smoothing weighs the new limit against the old one, in (0, 1];
	// default 1 (no smoothing).
	Smoothing float64
	// Probe is how many windows pass between resets of the no-load RTT
	// to the current window's mean, so that a backend that got
	// slower for good is measured again; default 1000, negative never.
	Probe int

	rtt noLoad
}

// Update implements Algorithm.
func (v *Vegas) Update(limit float64, w Window) float64 {
	base := v.rtt.update(w, v.Probe)
	l10 := max(1, math.Log10(limit))
	var next float64
	switch {
	case w.Dropped > 0:
		next = limit - l10
	case appLimited(limit, w) || w.AvgRTT <= 0 || base <= 0:
		return limit
	default:
		queue := math.Ceil(limit * (1 - float64(base)/v.rtt.short))
		switch {
		case queue <= l10:
			next = limit + 6*l10
		case queue < 3*l10:
			next = limit + l10
		case queue > 6*l10:
			next = limit - l10
		default:
			return limit
		}
	}
	s := v.Smoothing
	if s <= 0 || s > 1 {
		s = 1
	}
	return limit*(1-s) + next*s
}

// Gradient2 compares the short-term RTT (the window's mean) with a
// long-term RTT: the limit is multiplied by gradient = Tolerance × long /
// short, clamped to [0.5, 1], plus QueueSize, and smoothed. A window with
// a drop counts as a gradient of 0.5.
//
// The long-term RTT is the RTT without a queue. It never rises from a
// window that tests the limit: that window's RTT holds the queue the limit
// builds, and learning it would let the limit, then the queue, climb
// without bound under a sustained overload. It falls (an exponential
// average over LongWindows windows) whenever a window is faster. And it
// is measured: after the first 10 windows (whose mean it starts from),
// then every Probe windows. A probe holds the limit at QueueSize (or
// Config.Min, if more) until a window had no more than that in flight,
// lets one more window pass so that the requests queued behind them
// finish, takes the mean RTT of the next windows, until they hold 50
// successes, as the long-term RTT, and gives the limit back. So a backend that got slower for good is learned within
// Probe windows. A probe costs a few windows at a limit of QueueSize (in
// the simulation of docs/adaptive.md, about 0.5 s of the backend's
// throughput every 100 s).
//
// Use one Gradient2 per Limiter (it keeps the long-term RTT); the zero
// value is the defaults.
type Gradient2 struct {
	// Tolerance is how much slower than the long-term RTT the short-term
	// one may be before the limit shrinks; default 1.5.
	Tolerance float64
	// Smoothing weighs the new limit against the old one, in (0, 1];
	// default 0.2.
	Smoothing float64
	// LongWindows is how many windows the long-term RTT's fall averages
	// over; default 600.
	LongWindows int
	// QueueSize is added to the limit each window, letting it probe
	// upward, and is the limit while the long-term RTT is measured;
	// default 4.
	QueueSize float64
	// Probe is how many windows pass between measurements of the
	// long-term RTT; default 1000, negative never.
	Probe int

	long    float64 // ns
	windows int
	probe   probeState
	saved   float64 // the limit before the probe
	sum     float64 // of the RTTs measured by the probe, ns
	n       int     // how many
}

// probeSamples is how many successes a probe measures the long-term RTT
// over: the mean of 50 log-normal service times of coefficient of
// variation 0.5 is within ±14% of theirs 95% of the time.

const probeSamples = 50

// probeState is where a Gradient2 is in measuring the long-term RTT.
type probeState uint8

const (
	probeOff     probeState = iota
	probeDrain              // the limit is QueueSize; the queue drains
	probeSettle             // the queue drained; this window may still release requests admitted before
	probeMeasure            // this window's mean is the long-term RTT
)

// Update implements Algorithm.
func (g *Gradient2) Update(limit float64, w Window) float64 {
	tol, sm, span, queue, every := g.Tolerance, g.Smoothing, g.LongWindows, g.QueueSize, g.Probe
	if tol <= 0 {
		tol = 1.5
	}
	if sm <= 0 || sm > 1 {
		sm = 0.2
	}
	if span <= 0 {
		span = 600
	}
	if queue <= 0 {
		queue = 4
	}
	if every == 0 {
		every = 1000
	}
	switch g.probe {
	case probeDrain: // limit is QueueSize, or Config.Min if that is more
		if float64(w.MaxInFlight) <= limit {
			g.probe = probeSettle
		}
		return queue
	case probeSettle:
		g.probe = probeMeasure
		return queue
	case probeMeasure:
		g.sum += float64(w.AvgRTT) * float64(w.Samples)
		if g.n += w.Samples; g.n < probeSamples { // too few for a mean: measure on
			return queue
		}
		g.long, g.probe = g.sum/float64(g.n), probeOff
		g.sum, g.n = 0, 0
		return g.saved
	}
	if g.windows++; every > 0 && (g.windows == 11 || g.windows%every == 0) {
		g.probe, g.saved = probeDrain, limit
		return queue
	}
	gradient := 0.5
	if w.Dropped == 0 {
		if w.AvgRTT <= 0 {
			return limit
		}
		short := float64(w.AvgRTT)
		switch {
		case g.windows <= 10: // a plain mean until the average has enough weight
			g.long += (short - g.long) / float64(g.windows)
		case short < g.long:
			g.long += (short - g.long) * 2 / float64(span+1)
		}
		if appLimited(limit, w) {
			return limit
		}
		gradient = min(max(tol*g.long/short, 0.5), 1)
	}
	return limit*(1-sm) + (limit*gradient+queue)*sm
}
