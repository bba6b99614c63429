package envoyrls

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Memory is the in-process Backend: one node, no store. Fixed windows
// are counters per key and window, updated by compare-and-swap and
// atomic adds (no lock); the other algorithms are the limiters of
// packages tokenbucket, slidingwindow and slidinglog, one per distinct
// limit. Safe for concurrent use; the zero value is not usable: use
// NewMemory, and Close it.
type Memory struct {
	counters  sync.Map // counter key → *fwCounter
	limiters  sync.Map // limiterSpec → throttle.Limiter
	lastSweep atomic.Int64
	closed    atomic.Bool
}

// NewMemory returns an empty in-process backend.
func NewMemory() *Memory { return &Memory{} }

// sweepEvery is how often expired fixed-window counters are removed.
const sweepEvery = 10 * time.Second

// fwCounter holds a key's current fixed window.
type fwCounter struct{ slot atomic.Pointer[fwSlot] }

// fwSlot is one window of a key: it opened at start, closes at end
// (Unix seconds), and n hits were charged to it.
type fwSlot struct {
	start, end int64
	n          atomic.Uint64
}

// dead marks a counter removed by the sweep: a charger finding it takes
// a fresh counter.
var dead = &fwSlot{}

// Charge implements Backend.
func (m *Memory) Charge(ctx context.Context, now time.Time, hits []Hit, out []Outcome) error {
	if m.closed.Load() {
		return throttle.ErrClosed
	}
	m.maybeSweep(now)
	for i, h := range hits {
		if h.Limit.Algorithm == FixedWindow {
			after := m.add(h.Key, windowStart(now, h.Limit.Unit), h.Limit.Unit.Seconds(), h.N)
			out[i] = fixedOutcome(now, h.Limit, h.N, after)
			continue
		}
		o, err := allowHit(ctx, h, m.limiter)
		if err != nil {
			return err
		}
		out[i] = o
	}
	return nil
}

// add charges n to key's window opening at start, and returns the count
// after. A window already opened later (a clock read earlier than
// another goroutine's) takes the hits instead.
func (m *Memory) add(key string, start, length int64, n uint64) uint64 {
	for {
		v, ok := m.counters.Load(key)
		if !ok {
			v, _ = m.counters.LoadOrStore(key, &fwCounter{})
		}
		c := v.(*fwCounter)
		for {
			s := c.slot.Load()
			if s == dead {
				m.counters.CompareAndDelete(key, c)
				break
			}
			if s != nil && s.start >= start {
				return s.n.Add(n)
			}
			ns := &fwSlot{start: start, end: start + length}
			ns.n.Store(n)
			if c.slot.CompareAndSwap(s, ns) {
				return n
			}
		}
	}
}

// maybeSweep removes the counters whose window has closed, at most once
// per sweepEvery, in the goroutine that finds it due.
func (m *Memory) maybeSweep(now time.Time) {
	last, t := m.lastSweep.Load(), now.UnixNano()
	if t-last < int64(sweepEvery) || !m.lastSweep.CompareAndSwap(last, t) {
		return
	}
	sec := now.Unix()
	m.counters.Range(func(k, v any) bool {
		c := v.(*fwCounter)
		if s := c.slot.Load(); s != nil && s != dead && s.end <= sec && c.slot.CompareAndSwap(s, dead) {
			m.counters.CompareAndDelete(k, c)
		}
		return true
	})
}

// Len is the number of keys with a fixed-window counter.
func (m *Memory) Len() int {
	n := 0
	m.counters.Range(func(any, any) bool { n++; return true })
	return n
}

// limiterSpec identifies the limiter of a non-fixed-window limit.
type limiterSpec struct {
	alg   Algorithm
	rpu   uint32
	unit  Unit
	burst uint32
}

func specOf(l *RateLimit) limiterSpec {
	return limiterSpec{alg: l.Algorithm, rpu: l.RequestsPerUnit, unit: l.Unit, burst: l.Burst}
}

// newLimiter builds the keyed limiter of spec from this module's
// limiter packages.
func newLimiter(s limiterSpec) (throttle.Limiter, error) {
	limit, per := int(s.rpu), s.unit.Period()
	switch s.alg {
	case TokenBucket:
		burst := int(s.burst)
		if burst == 0 {
			burst = limit
		}
		return tokenbucket.New(throttle.NewRate(limit, per), burst)
	case SlidingWindow:
		return slidingwindow.New(limit, per)
	case SlidingLog:
		return slidinglog.New(limit, per)
	}
	return nil, fmt.Errorf("%w: %v", ErrUnsupported, s.alg)
}

func (m *Memory) limiter(l *RateLimit) (throttle.Limiter, error) {
	s := specOf(l)
	if v, ok := m.limiters.Load(s); ok {
		return v.(throttle.Limiter), nil
	}
	lim, err := newLimiter(s)
	if err != nil {
		return nil, err
	}
	v, loaded := m.limiters.LoadOrStore(s, lim)
	if loaded {
		closeLimiter(lim)
	}
	return v.(throttle.Limiter), nil
}

func closeLimiter(l throttle.Limiter) {
	if c, ok := l.(io.Closer); ok {
		c.Close()
	}
}

// Close releases the limiters; Charge then fails with throttle.ErrClosed.
func (m *Memory) Close() error {
	m.closed.Store(true)
	m.limiters.Range(func(k, v any) bool {
		closeLimiter(v.(throttle.Limiter))
		m.limiters.Delete(k)
		return true
	})
	return nil
}
