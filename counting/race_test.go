//go:build race

package counting

// raceOn skips the allocation test under the race detector.
const raceOn = true
