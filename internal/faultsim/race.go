//go:build race

package faultsim

// raceEnabled is true under the race detector: Run then runs a tenth of
// the seeds.
const raceEnabled = true
