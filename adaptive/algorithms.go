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
// does) and multiplies it by Backoff on a window with a drop. It keeps no
// state; the zero value is the defaults.
type AIMD struct {
	// Backoff is the factor applied on a drop, in (0, 1); default 0.9.
	Backoff float64
}

// Update implements Algorithm.
func (a *AIMD) Update(limit float64, w Window) float64 {
	if w.Dropped > 0 {
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

// Vegas estimates the requests queued at the backend as
// limit × (1 − RTTnoload / RTT), RTT being a window's mean RTT and
// RTTnoload the least such mean seen (not the least single RTT, which
// under a spread of service times is far below the mean even with no
// queue, and would hold the limit down), and
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

	noLoad  time.Duration
	windows int
}

// Update implements Algorithm.
func (v *Vegas) Update(limit float64, w Window) float64 {
	probe := v.Probe
	if probe == 0 {
		probe = 1000
	}
	if v.windows++; probe > 0 && v.windows%probe == 0 {
		v.noLoad = 0
	}
	if w.AvgRTT > 0 && (v.noLoad == 0 || w.AvgRTT < v.noLoad) {
		v.noLoad = w.AvgRTT
	}
	l10 := max(1, math.Log10(limit))
	var next float64
	switch {
	case w.Dropped > 0:
		next = limit - l10
	case appLimited(limit, w) || w.AvgRTT <= 0:
		return limit
	default:
		queue := math.Ceil(limit * (1 - float64(v.noLoad)/float64(w.AvgRTT)))
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
