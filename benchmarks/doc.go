// Package benchmarks compares this module's rate limiters with each other
// and with peer libraries, on identical workloads, for speed and for how
// exactly they limit. It is a tool of this repository: the peers are
// imported here and nowhere else, and no library package imports this one.
//
// Every limiter under comparison is a Subject: this module's algorithms
// as they are, and each peer behind a thin adapter to throttle.Limiter
// (see Subjects; adding one is one line in ours.go or an adapter in
// peers.go). All are built from the same Config, Limit units per Window.
//
// Speed (RunSpeed, and BenchmarkSpeed for go test): Allow on one key,
// allowed and denied, serial and with b.RunParallel, and on 100k and 1M
// distinct keys. Samples of all subjects are interleaved in rounds and
// the median is reported, with B/op and allocs/op.
//
// Accuracy (RunAccuracy): deterministic traces (Traces) are replayed on
// virtual time (throttletest.Clock) for every subject that takes a clock,
// and on the wall clock, with a shorter window, for those that do not.
// Each run is scored against an exact reference token bucket on the same
// arrivals (admitted/ideal), by the most units admitted in any interval
// of one window, and by how soon a denied client is admitted again.
// Contention runs 8 goroutines on one key on the wall clock.
//
// The command benchmarks/cmd/compare runs all of it, prints Markdown
// tables and draws PNG charts into docs/.
package benchmarks
