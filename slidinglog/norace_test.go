//go:build !race

package slidinglog

const raceOn = false
