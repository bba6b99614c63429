// Package gcfloor keeps the garbage collector's goal of a server command
// at a floor while its live heap is small.
//
// Every call a server answers allocates a few kilobytes of short-lived
// objects (most of them grpc-go's and protobuf's), and the live heap of a
// server with a small table is a few megabytes: at Go's default (GOGC=100,
// a goal of twice the live heap, at least 4 MiB) the collector runs
// several times a second under load, and its marking and assists take
// about a tenth of a call's CPU. Run keeps the goal at least MinHeapGoal
// while the live heap is small, and at Go's default above that. GOGC, when
// set, is obeyed instead; GOMEMLIMIT applies either way.
package gcfloor

import (
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"
)

const (
	// MinHeapGoal is the least goal Run keeps.
	MinHeapGoal = 64 << 20
	// MaxPercent bounds the goal at 11 times the live heap.
	MaxPercent = 1000
)

// Percent returns the GOGC whose goal for a live heap of live bytes is
// MinHeapGoal or twice the live heap, whichever is larger, within
// MaxPercent.
func Percent(live uint64) int {
	if live >= MinHeapGoal/2 {
		return 100
	}
	return int(min(MinHeapGoal*100/max(live, 1)-100, MaxPercent))
}

// Run sets the collector's percent from the live heap after the last
// cycle, every interval, until stop is closed (never, when it is nil),
// then sets Go's default (100) back. It returns at once when GOGC is set.
// A command runs it in a goroutine of its own; one at a time per process.
func Run(interval time.Duration, stop <-chan struct{}) {
	if os.Getenv("GOGC") != "" {
		return
	}
	live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	set := 100
	defer func() {
		if set != 100 {
			debug.SetGCPercent(100)
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rtmetrics.Read(live)
		if live[0].Value.Kind() == rtmetrics.KindUint64 {
			if p := Percent(live[0].Value.Uint64()); p != set {
				debug.SetGCPercent(p)
				set = p
			}
		}
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

// Current returns the collector's percent (GOGC) in force.
func Current() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}
