package main

import (
	"runtime"
	"testing"
)

func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, maxGCPercent},
		{1 << 20, maxGCPercent},  // 64 MiB would be 63 times the live heap
		{8 << 20, 700},           // a goal of 64 MiB
		{16 << 20, 300},          // a goal of 64 MiB
		{minHeapGoal/2 - 1, 100}, // just below: twice the live heap is the goal
		{minHeapGoal / 2, 100},   // Go's default from here on
		{1 << 30, 100},
	} {
		if got := gcPercent(tc.live); got != tc.want {
			t.Errorf("gcPercent(%d) = %d, want %d", tc.live, got, tc.want)
		}
	}
}

// TestFloorProcs: two Ps where Go would give one, unless GOMAXPROCS is
// set; more are left alone.
func TestFloorProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		env         string
		procs, want int
	}{
		{"", 1, 2},
		{"", 3, 3},
		{"1", 1, 1},
	} {
		t.Setenv("GOMAXPROCS", tc.env)
		runtime.GOMAXPROCS(tc.procs)
		floorProcs()
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("GOMAXPROCS=%q at %d procs: floorProcs left %d, want %d", tc.env, tc.procs, got, tc.want)
		}
	}
}
