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
// long-term exponential average of it: the limit is multiplied by
// gradient = Tolerance × long / short, clamped to [0.5, 1], plus
// QueueSize, and smoothed. A long-term average more than twice the
// short-term one decays, so the limit recovers after a slow spell. A
// window with a drop counts as a gradient of 0.5. Use one Gradient2 per
// Limiter (it keeps the average); the zero value is the defaults.
type Gradient2 struct {
	// Tolerance is how much slower than the long-term RTT the short-term
	// one may be before the limit shrinks; default 1.5.
	Tolerance float64
	// Smoothing weighs the new limit against the old one, in (0, 1];
	// default 0.2.
	Smoothing float64
	// LongWindows is how many windows the long-term average spans;
	// default 600.
	LongWindows int
	// QueueSize is added to the limit each window, letting it probe
	// upward; default 4.
	QueueSize float64

	long    float64 // ns
	windows int
}

// Update implements Algorithm.
func (g *Gradient2) Update(limit float64, w Window) float64 {
	tol, sm, span, queue := g.Tolerance, g.Smoothing, g.LongWindows, g.QueueSize
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
	gradient := 0.5
	if w.Dropped == 0 {
		if w.AvgRTT <= 0 {
			return limit
		}
		short := float64(w.AvgRTT)
		g.windows++
		switch {
		case g.windows <= 10: // a plain mean until the average has enough weight
			g.long += (short - g.long) / float64(g.windows)
		default:
			g.long += (short - g.long) * 2 / float64(span+1)
		}
		if g.long/short > 2 {
			g.long *= 0.95
		}
		if appLimited(limit, w) {
			return limit
		}
		gradient = min(max(tol*g.long/short, 0.5), 1)
	}
	return limit*(1-sm) + (limit*gradient+queue)*sm
}
