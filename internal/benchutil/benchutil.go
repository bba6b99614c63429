// Package benchutil holds what the benchmarks beside the algorithms share:
// a serial runner that reports CPU time per call, and distinct keys.
package benchutil

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
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

// Visit returns keys in the order timed calls visit them: a fixed
// shuffle, not the order in which they were first seen. Traffic does not
// come in the order its keys were inserted in, and visiting keys in
// insertion order would let a limiter that allocates per key find each
// key's memory next to the previous one's, hiding what a look-up costs.
//
// Each returned key is a copy, the copies laid out in visit order: a server
// limits on a key it has just read from the request, in cache. Reading the
// bytes of keys made in another order would add to every call a cache miss
// that no limiter causes (a limiter that stores keys still reads its own
// copy).
func Visit(keys []string) []string {
	v := append([]string(nil), keys...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
	for i := range v {
		v[i] = strings.Clone(v[i])
	}
	return v
}

// ParallelKeys calls l.Allow(ctx, key, 1) from every CPU over n distinct
// keys, each of them seen once before the timer starts, so that the timed
// calls find live keys, and visited in the order of Visit.
func ParallelKeys(b *testing.B, l throttle.Limiter, n int) {
	ctx := context.Background()
	keys := Keys(n)
	for _, k := range keys {
		l.Allow(ctx, k, 1)
	}
	keys = Visit(keys)
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
