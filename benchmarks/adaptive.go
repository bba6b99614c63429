package benchmarks

import (
	"time"

	"github.com/go-kratos/aegis/ratelimit"
	"github.com/go-kratos/aegis/ratelimit/bbr"
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/adaptivesim"
)

// AdaptiveSubjects returns the subjects of the adaptive simulation:
// adaptivesim's (this module's adaptive limiters and two fixed limits)
// and go-kratos/aegis's BBR limiter.
//
// aegis reads the wall clock (time.Now) and takes no clock, so its run
// must happen in a testing/synctest bubble, whose fake time Run moves with
// BubbleAt. It sheds load only while its CPU input is at or above its
// threshold, and that input is the process's own CPU usage, sampled by a
// goroutine aegis starts, with no way to feed it another: in a
// simulation it would be the simulator's CPU, not the backend's. The
// simulated backend is saturated whenever load is shed at all (every
// server busy: usage 100%, above the default 80%), so the subject runs
// with a threshold of 0, as if the CPU were always over it: then its
// inflight bound (the most requests passed in a bucket × the least
// bucket's mean RTT) always applies.
func AdaptiveSubjects() []adaptivesim.Subject {
	return append(adaptivesim.Subjects(), adaptivesim.Subject{
		Name: "aegis BBR",
		New:  func(throttle.Clock) adaptivesim.Gate { return aegisGate{bbr.NewLimiter(bbr.WithCPUThreshold(0))} },
	})
}

// aegisGate is an adaptivesim.Gate over aegis's BBR limiter; its limit
// is the inflight bound it computes.
type aegisGate struct{ l *bbr.BBR }

func (g aegisGate) Admit() func(time.Duration) {
	done, err := g.l.Allow()
	if err != nil {
		return nil
	}
	return func(time.Duration) { done(ratelimit.DoneInfo{}) } // aegis measures the RTT itself
}

func (g aegisGate) Limit() int { return int(g.l.Stat().MaxInFlight) }

// BubbleAt is the at of adaptivesim.Run for a gate that reads the wall
// clock inside a testing/synctest bubble: it sleeps until the run's start
// (the time when BubbleAt was called) plus d, which in the bubble takes
// no real time. It moves the clock in whole milliseconds, the resolution
// of aegis's RTTs, so the gate sees each event up to 1 ms early; a sleep
// per event would make the run a few times slower.
func BubbleAt() func(d time.Duration) {
	start, last := time.Now(), time.Duration(0)
	return func(d time.Duration) {
		if d = d.Truncate(time.Millisecond); d > last {
			last = d
			time.Sleep(time.Until(start.Add(d)))
		}
	}
}
