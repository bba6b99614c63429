package leakybucket

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/clock"
	"github.com/throttlekit/throttle/internal/gcra"
)

// Unbounded is the maxWait of a Pacer whose queue has no bound: every
// caller is given a slot, however far ahead.
const Unbounded = time.Duration(math.MaxInt64)

// Pacer is the leaky bucket as a queue: it spaces callers out to one per
// interval of its rate, each caller waiting for its own slot, in arrival
// order. The state is one int64 updated by compare-and-swap (the next
// free slot, shifted by the slack); there is no goroutine and no lock.
//
// All methods are safe for concurrent use. The zero value is not usable;
// create a Pacer with NewPacer.
type Pacer struct {
	g       gcra.Single
	maxWait time.Duration
}

// NewPacer returns a pacer granting one slot per rate.Duration(1).
//
// slack is how many missed slots may be used as catch-up after an idle
// spell: with slack 0 callers are never closer than one interval apart;
// with slack s, up to s+1 callers pass at once after an idle spell of at
// least s intervals. A fresh pacer counts as idle. (go.uber.org/ratelimit
// defaults to a slack of 10.)
//
// maxWait bounds the queue: a caller whose slot is more than maxWait away
// is rejected (Take and Reserve fail with ErrLimited) and books nothing.
// Use Unbounded for no bound, 0 to never wait.
//
// The only Option it reads is WithClock: an injected clock sets the
// schedule, but Take still sleeps on the runtime's timers (which
// testing/synctest makes virtual). Errors wrap throttle.ErrInvalid.
func NewPacer(rate throttle.Rate, slack int, maxWait time.Duration, opts ...throttle.Option) (*Pacer, error) {
	if slack < 0 || slack == math.MaxInt {
		return nil, fmt.Errorf("%w: slack must be in [0, MaxInt), got %d", throttle.ErrInvalid, slack)
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("%w: negative maxWait %v", throttle.ErrInvalid, maxWait)
	}
	p := &Pacer{maxWait: maxWait}
	if err := p.g.Init(rate, slack+1, opts...); err != nil {
		return nil, err
	}
	return p, nil
}

// book takes the next slot; see Reserve.
func (p *Pacer) book() (delay time.Duration, tat, cost int64, err error) {
	if p.g.Config() == nil {
		return 0, 0, 0, fmt.Errorf("%w: zero Pacer: use NewPacer", throttle.ErrInvalid)
	}
	delay, tat, cost, ok := p.g.Book(1, p.maxWait)
	if !ok && tat == gcra.End {
		return 0, 0, 0, gcra.ErrEndOfTime
	}
	if !ok {
		return delay, 0, 0, fmt.Errorf("%w: pacer queue full: the next slot is more than %v away", throttle.ErrLimited, p.maxWait)
	}
	return delay, tat, cost, nil
}

// Reserve books the next slot and returns how long to wait for it, without
// sleeping; the caller must not act before then. The slot cannot be given
// back. If the slot is more than maxWait away, nothing is booked and the
// error wraps throttle.ErrLimited; the duration is then how much later a
// caller would find a slot within maxWait.
func (p *Pacer) Reserve() (time.Duration, error) {
	d, _, _, err := p.book()
	return d, err
}

// Take books the next slot and sleeps until it. It returns nil at the
// slot, an error wrapping throttle.ErrLimited at once if the slot is more
// than maxWait away, and ctx.Err() if ctx ends first (before booking, or
// while sleeping) — at once, wrapping context.DeadlineExceeded, if the
// deadline comes before the slot. A slot abandoned that way is given back
// when no later slot was booked since; otherwise it goes unused, and
// callers behind it keep theirs (the queue does not move up).
func (p *Pacer) Take(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	delay, tat, cost, err := p.book()
	if err != nil || delay == 0 {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
		p.g.Refund(tat, cost)
		return fmt.Errorf("leakybucket: pacer slot is %v away, beyond the deadline: %w", delay, context.DeadlineExceeded)
	}
	if err := clock.Sleep(ctx, delay); err != nil {
		p.g.Refund(tat, cost)
		return err
	}
	return nil
}

// Allow takes n slots if they are all due now, without waiting or queueing,
// and otherwise takes nothing and reports in RetryAfter when they will be.
// Limit is slack+1, the most slots granted at once. The key is ignored.
// Errors wrap throttle.ErrInvalid (n <= 0, a zero Pacer) or
// throttle.ErrExceedsLimit (n > slack+1).
func (p *Pacer) Allow(_ context.Context, _ string, n int) (d throttle.Decision, err error) {
	err = p.g.AllowN(&d, n)
	return d, err
}

// Rate returns the pacing rate (the zero Rate on a zero Pacer).
func (p *Pacer) Rate() throttle.Rate { return gcra.RateOf(p.g.Config()) }

// Slack returns the number of missed slots that may be caught up (0 on a
// zero Pacer).
func (p *Pacer) Slack() int { return max(gcra.BurstOf(p.g.Config())-1, 0) }

// Quota reports slack+1 slots (the most granted at once) and the time they
// take at the pacer's rate.
func (p *Pacer) Quota() throttle.Quota { return gcra.QuotaOf(p.g.Config()) }
