package gcfloor

import "testing"

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, MaxPercent},
		{1 << 20, MaxPercent},    // 64 MiB would be 63 times the live heap
		{8 << 20, 700},           // a goal of 64 MiB
		{16 << 20, 300},          // a goal of 64 MiB
		{MinHeapGoal/2 - 1, 100}, // just below: twice the live heap is the goal
		{MinHeapGoal / 2, 100},   // Go's default from here on
		{1 << 30, 100},
	} {
		if got := Percent(tc.live); got != tc.want {
			t.Errorf("Percent(%d) = %d, want %d", tc.live, got, tc.want)
		}
	}
}
