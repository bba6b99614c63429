//go:build race

package slidinglog

// raceOn shortens the longest tests under the race detector, and skips
// the allocation test.
const raceOn = true
