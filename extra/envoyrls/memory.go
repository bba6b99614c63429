package envoyrls

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/tokenbucket"
)

// Memory is the in-process Backend: one node, no store. Fixed windows
// are counters per key and window start (as the reference's keys),
// updated by compare-and-swap (no lock); the other algorithms are the
// limiters of packages tokenbucket, slidingwindow and slidinglog, one per
// distinct limit. Safe for concurrent use; the zero value is not usable:
// use NewMemory, and Close it.
type Memory struct {
	counters  sync.Map // counter key → *fwCounter
	keys      atomic.Int64
	maxKeys   int64
	limiters  sync.Map // limiterSpec → throttle.Limiter
	lastSweep atomic.Int64
	closed    atomic.Bool
}

// defaultMaxKeys bounds the fixed-window counters of NewMemory(0).
const defaultMaxKeys = 1_000_000

// NewMemory returns an empty in-process backend that keeps about maxKeys
// fixed-window counters at most (0: 1,000,000; about 150 bytes
// each). Past it, a new key of a rule is counted in one counter shared by
// all the overflowing keys of that rule: still limited, never admitted
// unlimited. The counters of closed windows are removed within
// sweepEvery of their end.
func NewMemory(maxKeys int) *Memory {
	if maxKeys <= 0 {
		maxKeys = defaultMaxKeys
	}
	return &Memory{maxKeys: int64(maxKeys)}
}

// sweepEvery is how often expired fixed-window counters are removed.
const sweepEvery = 10 * time.Second

// fwCounter is one window of a key: it closes at end (Unix seconds);
// n is the hits charged to it, with deadBit set once the sweep removed it.
type fwCounter struct {
	end int64
	n   atomic.Uint64
}

// deadBit marks a counter removed by the sweep: a charger finding it
// takes a fresh counter.
const deadBit = 1 << 63

// charge implements Backend.
func (m *Memory) charge(ctx context.Context, now time.Time, hits []hit, out []outcome) error {
	if m.closed.Load() {
		return throttle.ErrClosed
	}
	m.maybeSweep(now)
	for i, h := range hits {
		if h.Limit.algorithm == fixedWindow {
			start := windowStart(now, h.Limit.rlUnit)
			after := m.add(h.Key, h.Limit.Key, start, start+h.Limit.rlUnit.Seconds(), h.N)
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

// add charges n to the counter of key in the window opening at start
// (named by both, as the reference's Redis keys are), closing at end, and
// returns the count after.
func (m *Memory) add(key, rule string, start, end int64, n uint64) uint64 {
	key += strconv.FormatInt(start, 10)
	for {
		k, c := m.counter(key, rule, start, end)
		for {
			old := c.n.Load()
			if old&deadBit != 0 {
				m.remove(k, c)
				break
			}
			after := old + n
			if after&deadBit != 0 {
				return old // saturated: over any limit
			}
			if c.n.CompareAndSwap(old, after) {
				return after
			}
		}
	}
}

// counter finds or makes the counter of key, or past maxKeys the one of
// rule's overflow in that window; it returns the key it is stored under.
func (m *Memory) counter(key, rule string, start, end int64) (string, *fwCounter) {
	if v, ok := m.counters.Load(key); ok {
		return key, v.(*fwCounter)
	}
	if m.keys.Load() >= m.maxKeys {
		key = "\x00overflow\x00" + rule + "\x00" + strconv.FormatInt(start, 10)
	}
	v, loaded := m.counters.LoadOrStore(key, &fwCounter{end: end})
	if !loaded {
		m.keys.Add(1)
	}
	return key, v.(*fwCounter)
}

// remove deletes the dead counter c of key, once.
func (m *Memory) remove(key any, c *fwCounter) {
	if m.counters.CompareAndDelete(key, c) {
		m.keys.Add(-1)
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
		if c.end > sec {
			return true
		}
		for {
			old := c.n.Load()
			if old&deadBit != 0 || c.n.CompareAndSwap(old, old|deadBit) {
				break
			}
		}
		m.remove(k, c)
		return true
	})
}

// Len is the number of fixed-window counters (a key's window each).
func (m *Memory) size() int { return int(m.keys.Load()) }

// limiterSpec identifies the limiter of a non-fixed-window limit.
type limiterSpec struct {
	alg   algorithm
	rpu   uint32
	unit  rlUnit
	burst uint32
}

func specOf(l *limitRule) limiterSpec {
	return limiterSpec{alg: l.algorithm, rpu: l.RequestsPerUnit, unit: l.rlUnit, burst: l.Burst}
}

// newLimiter builds the keyed limiter of spec from this module's
// limiter packages.
func newLimiter(s limiterSpec) (throttle.Limiter, error) {
	limit, per := int(s.rpu), s.unit.Period()
	switch s.alg {
	case tokenBucket:
		burst := int(s.burst)
		if burst == 0 {
			burst = limit
		}
		return tokenbucket.New(throttle.NewRate(limit, per), burst)
	case slidingWindow:
		return slidingwindow.New(limit, per)
	case slidingLog:
		return slidinglog.New(limit, per)
	}
	return nil, fmt.Errorf("%w: %v", errUnsupported, s.alg)
}

func (m *Memory) limiter(l *limitRule) (throttle.Limiter, error) {
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
