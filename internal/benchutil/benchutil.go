// Package benchutil holds what the benchmarks beside the algorithms share:
// a serial runner that reports CPU time per call, and distinct keys.
package benchutil

import (
	"context"
	"runtime"
	"strconv"
	"testing"

	"github.com/throttlekit/throttle"
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

// ParallelKeys calls l.Allow(ctx, key, 1) from every CPU over n distinct
// keys, each of them seen once before the timer starts, so that the timed
// calls find live keys.
func ParallelKeys(b *testing.B, l throttle.Limiter, n int) {
	ctx := context.Background()
	keys := Keys(n)
	for _, k := range keys {
		l.Allow(ctx, k, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.Allow(ctx, keys[i%len(keys)], 1)
			i += 7
		}
	})
}
