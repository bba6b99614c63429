// Package envoyrls measures the Envoy rate-limit service of
// extra/envoyrls beside the reference, envoyproxy/ratelimit, on the same
// Redis and the same configuration: decisions per second and p99 latency
// at 1, 16 and 64 concurrent gRPC streams, with 1 and 4 descriptors per
// request, on one hot key and on 100,000 keys; and the service in process
// and across 3 gossip nodes. It is run by hand (see TestVersusReference
// and docs/performance.md), not in CI.
//
// -server-cpus and -loadgen-cpus (CPU lists, as taskset -c takes them)
// run the servers and Redis on CPUs of their own and the load generator,
// the test process, on others: on two cores, -server-cpus 1
// -loadgen-cpus 0. The servers start pinned, so a Go server sizes
// GOMAXPROCS to its CPUs.
package envoyrls
