// Package benchutil holds what the benchmarks beside the algorithms share:
// a serial runner that reports CPU time per call, and distinct keys.
package benchutil

import (
	"runtime"
	"strconv"
	"testing"
)

// Serial runs f b.N times on one locked thread, reporting allocations and,
// where the platform tells it, "cpu-ns/op": the thread's CPU time per call,
// which, unlike ns/op, does not count time the machine spent elsewhere.
func Serial(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	start, ok := threadCPU()
	for b.Loop() {
		f()
	}
	if end, ok2 := threadCPU(); ok && ok2 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}

// Keys returns n distinct keys ("user:0", "user:7919", ...).
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i*7919)
	}
	return keys
}
