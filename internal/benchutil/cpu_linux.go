//go:build linux

package benchutil

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time used by the calling thread, so that a
// benchmark locked to its thread can report the cost of an operation free
// of the time the machine gave to other processes.
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
