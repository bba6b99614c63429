//go:build race

package slidinglog

// raceOn shortens the longest tests under the race detector.
const raceOn = true
