//go:build !race

package adaptive

const raceOn = false
