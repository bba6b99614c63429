package main

import (
	"os"
	"runtime"
)

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
