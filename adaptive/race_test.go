//go:build race

package adaptive

// raceOn skips the allocation tests under the race detector.
const raceOn = true
