package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttle"
)

// hit is one descriptor's share of a request, as a Backend charges it.
type hit struct {
	// Key is the descriptor's counter key (no window in it).
	Key string
	// Limit is the rule, or the request's override (always a fixed
	// window).
	Limit *limitRule
	// N is the hits to charge; 0 asks without charging.
	N uint64
}

// outcome is a Backend's answer for one hit.
type outcome struct {
	Over      bool
	Remaining uint32
	// Reset is the time until the limit is whole again: the end of the
	// fixed window, or the algorithm's ResetAfter.
	Reset time.Duration
	// Before and After are the fixed window's count before and after
	// the hits (the near-limit metrics use them); 0 for the other
	// algorithms.
	Before, After uint64
}

// Backend counts the hits of the service's requests: Memory, Redis or
// Fleet (its method is unexported, so that a backend's contract can
// change without breaking users). Each charges the hits of one request,
// all of them, and fills out (one outcome per hit, in order); an error
// (wrapping throttle.ErrUnavailable when the store is down) fails the
// whole request. Implementations are safe for concurrent use.
type Backend interface {
	charge(ctx context.Context, now time.Time, hits []hit, out []outcome) error
}

// errUnsupported is returned by a Backend asked for an algorithm it does
// not run; it wraps throttle.ErrInvalid.
var errUnsupported = fmt.Errorf("envoyrls: algorithm not supported by this backend: %w", throttle.ErrInvalid)

// windowStart is the Unix second the fixed window of u containing now
// opened at (windows are aligned to the epoch, as the reference's).
func windowStart(now time.Time, u rlUnit) int64 {
	s, d := now.Unix(), u.Seconds()
	return s - s%d
}

// fixedOutcome is the reference's decision for a count going from
// after-n to after under limit.
func fixedOutcome(now time.Time, l *limitRule, n, after uint64) outcome {
	o := outcome{After: after, Before: after - min(n, after)}
	d := l.rlUnit.Seconds()
	o.Reset = time.Duration(d-now.Unix()%d) * time.Second
	if after > uint64(l.RequestsPerUnit) {
		o.Over = true
	} else {
		o.Remaining = uint32(uint64(l.RequestsPerUnit) - after)
	}
	return o
}

// decisionOutcome maps a limiter's Decision (or its refusal of n above
// the limit) to an outcome.
func decisionOutcome(d throttle.Decision, err error) (outcome, error) {
	if errors.Is(err, throttle.ErrExceedsLimit) {
		return outcome{Over: true, Reset: d.ResetAfter}, nil
	}
	if err != nil {
		return outcome{}, err
	}
	o := outcome{Over: !d.Allowed, Reset: d.ResetAfter}
	if d.Allowed {
		o.Remaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	}
	return o, nil
}

// allowHit decides a hit of an algorithm other than the fixed window with
// the limiter limiter returns for its limit. Hits of 0 are answered
// under the limit without a check (these limiters have no read-only
// query).
func allowHit(ctx context.Context, h hit, limiter func(*limitRule) (throttle.Limiter, error)) (outcome, error) {
	if h.N == 0 {
		return outcome{Remaining: h.Limit.RequestsPerUnit}, nil
	}
	lim, err := limiter(h.Limit)
	if err != nil {
		return outcome{}, err
	}
	return decisionOutcome(lim.Allow(ctx, h.Key, int(min(h.N, math.MaxInt32))))
}
