package main

import (
	"runtime"
	"testing"
)

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
