//go:build race

package daemon_test

// race is whether the race detector runs: it slows everything several
// times, so tests of latency allow more.
const race = true
