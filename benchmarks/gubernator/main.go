// Command gubernator measures throttled (cmd/throttled, the daemon of
// package distributed/daemon) beside gubernator
// (github.com/gubernator-io/gubernator/v2 at v2.13.0), the distributed
// rate-limit service a user would run instead, on loopback:
//
//   - speed: decisions per second, the p50 and p99 latency of a round trip,
//     and the server's CPU time per decision (utime+stime from
//     /proc/PID/stat), with 1, 16 and 64 connections, each a closed loop
//     (one request in flight per connection);
//   - accuracy: one global limit across 3 nodes of each (throttled nodes
//     gossiping, gubernator nodes with the GLOBAL behavior), the load
//     spread over the nodes: admitted / allowed.
//
// Every server runs as a process of its own (throttled is built from
// this repository's cmd/throttled; a gubernator node is this command run
// as "gubernator node", which spawns gubernator's own Daemon), and so does
// the load generator ("gubernator load"), the same one for both. The
// subjects run alternately, round after round, and the report gives the
// median and the range of the rounds.
//
// It is a module of its own, outside the workspace (go.work): gubernator's
// dependencies (gRPC, etcd, OpenTelemetry, Kubernetes clients) must not
// change the versions the repository's modules are built and tested with.
// Run it from this directory with the workspace off:
//
//	cd benchmarks/gubernator && GOWORK=off go run . -rounds 5
//
// Its test is a short run of the whole comparison, skipped without a flag:
//
//	GOWORK=off go test -v -args -compare
//
// See docs/performance.md for the results and what they mean.
package main

import (
	"fmt"
	"os"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "node":
		err = nodeMain(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "load":
		err = loadMain(os.Args[2:])
	default:
		err = compareMain(os.Args[1:], os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gubernator:", err)
		os.Exit(1)
	}
}
