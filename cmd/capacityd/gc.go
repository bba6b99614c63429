package main

import (
	"os"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"
)

// The garbage collector's goal. Every call allocates a few kilobytes of
// short-lived objects (most of them grpc-go's and protobuf's), and the
// live heap of a server with a few hundred clients is a few megabytes: at
// Go's default (GOGC=100, a goal of twice the live heap, at least 4 MiB)
// the collector ran several times a second under load, and its marking
// and assists took about a tenth of a call's CPU. capacityd therefore
// keeps the goal at least minHeapGoal while the live heap is small, and
// at Go's default above that. GOGC, when set, is obeyed instead; GOMEMLIMIT
// applies either way.
const (
	minHeapGoal  = 64 << 20
	maxGCPercent = 1000 // the goal at most 11 times the live heap
)

// gcPercent returns the GOGC whose goal for a live heap of live bytes is
// minHeapGoal or twice the live heap, whichever is larger, within
// maxGCPercent.
func gcPercent(live uint64) int {
	if live >= minHeapGoal/2 {
		return 100
	}
	return int(min(minHeapGoal*100/max(live, 1)-100, maxGCPercent))
}

// floorGC sets the collector's percent from the live heap after the last
// cycle, every interval, for the life of the process; it returns at once
// when GOGC is set.
func floorGC(interval time.Duration) {
	if os.Getenv("GOGC") != "" {
		return
	}
	live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	set := 100
	for {
		rtmetrics.Read(live)
		if live[0].Value.Kind() == rtmetrics.KindUint64 {
			if p := gcPercent(live[0].Value.Uint64()); p != set {
				debug.SetGCPercent(p)
				set = p
			}
		}
		time.Sleep(interval)
	}
}

// floorProcs gives the scheduler two Ps where Go would give it one (a
// process on one CPU, or with a CPU quota of one), unless GOMAXPROCS is
// set. With one P, the process goes idle between bursts of calls, and the
// next system call wakes the runtime's monitor thread, which then polls
// every 20 µs for a millisecond; a P in a long write (on loopback, the
// write runs the receiver's network stack too) is handed to another
// thread. With two, both happen less often: on one CPU, under the
// comparison with Doorman's load, the monitor's share of the CPU went
// from 6.5% to 3.9%, the CPU per call fell 4.5–10% and the calls per
// second rose 18–20% (docs/performance.md). Call it before the servers start: their
// number of stream workers follows GOMAXPROCS.
func floorProcs() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) == 1 {
		runtime.GOMAXPROCS(2)
	}
}
