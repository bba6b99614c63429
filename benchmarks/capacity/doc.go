// Package capacity compares capacityd, the lease server of
// distributed/capacity, with the original open-source Doorman server
// (github.com/youtube/doorman) side by side: both run as separate
// processes on loopback with equivalent configurations (one resource of
// capacity 1000 divided by FairShare, 2 s leases refreshed every 1 s), and
// a load generator, in a process of its own, runs 100 concurrent clients
// that call GetCapacity over gRPC as fast as they are answered. Each round
// measures every server in turn (the order alternates) for a fixed
// window: calls per second, and the server's CPU time per call, read from
// /proc/<pid>/stat.
//
// Doorman is not part of this repository. Give the path of a Doorman
// server binary in THROTTLE_DOORMAN_SERVER; without it the comparison is
// skipped (THROTTLE_REQUIRE_DOORMAN=1 makes that a failure). capacityd is
// built from this checkout unless THROTTLE_CAPACITYD_SERVER names a
// binary; THROTTLE_CAPACITYD_BASELINE adds a second capacityd binary (an
// older build) to the same run, to compare two versions against each
// other:
//
//	cd benchmarks/capacity
//	THROTTLE_DOORMAN_SERVER=/path/to/doorman go test -run TestVersusDoorman -v -rounds 6 -window 5s .
//
// Each round prints one line per server in the benchmark format, so that
// benchstat summarizes the rounds (median and confidence interval):
//
//	go test ... | tee out.txt; benchstat -col /server out.txt
//
// Doorman is started standalone (no etcd: no master election, its
// configuration from a file), with its minimum refresh interval lowered to
// the configuration's 1 s and its logs in a temporary directory. Its
// server binds its gRPC and debug ports on every interface unless built to
// bind loopback; run the comparison where that is acceptable, or in a
// network namespace of its own. capacityd listens on loopback only. The
// load generator speaks Doorman's wire format with a minimal encoder of its
// own (protowire), and capacityd's with its generated messages, both over
// grpc-go; every client has its own connection.
package capacity
