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
// -server-cpus and -loadgen-cpus (CPU lists, as taskset -c takes them)
// run the servers and the load generators on CPUs of their own, so that
// the load generator does not take the servers' time nor they its: on two
// cores, -server-cpus 1 -loadgen-cpus 0. Go gives a server on one CPU
// GOMAXPROCS=1 (capacityd raises it to 2 unless GOMAXPROCS is set).
//
// Doorman is started standalone (no etcd: no master election, its
// configuration from a file), with its minimum refresh interval lowered to
// the configuration's 1 s and its logs in a temporary directory. Its
// server binds its gRPC and debug ports on every interface; run the
// comparison in a network namespace of its own, where only loopback is up
// (the modules must be in the module cache: the namespace has no network):
//
//	unshare -rn sh -c 'ip link set lo up && THROTTLE_DOORMAN_SERVER=/path/to/doorman \
//	  go test -run TestVersusDoorman -v -rounds 8 -window 5s -server-cpus 1 -loadgen-cpus 0 .'
//
// capacityd listens on loopback only. The load generator speaks Doorman's
// wire format with a minimal encoder of its own (protowire), and
// capacityd's with its generated messages, both over grpc-go; every client
// has its own connection.
//
// # Building Doorman
//
// Doorman's last commit (e2b69e1, 2016) predates Go modules. It builds
// with a go.mod of its own and today's modules, and two changes that do
// not change what a call does: grpc-go now passes a method's handler an
// interceptor (the handlers take it and leave it unused, as Doorman
// configures none), and the Prometheus client moved its metrics handler
// to promhttp. In a directory outside this repository:
//
//	git clone https://github.com/youtube/doorman && cd doorman
//	rm -rf vendor # empty submodules, replaced by the modules below
//	go mod init github.com/youtube/doorman
//	go get github.com/coreos/etcd/client@v3.3.27+incompatible github.com/golang/glog@v1.2.5 \
//	  github.com/golang/protobuf@v1.5.4 google.golang.org/grpc@v1.83.2 golang.org/x/net@v0.59.0 \
//	  github.com/prometheus/client_golang@v1.25.0 github.com/ghodss/yaml@v1.0.0
//	sed -i 's/dec func(interface{}) error) (interface{}, error) {/dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {/' \
//	  proto/doorman/doorman.pb.go
//	sed -i 's|"github.com/prometheus/client_golang/prometheus"$|"github.com/prometheus/client_golang/prometheus/promhttp"|; s|prometheus.Handler()|promhttp.Handler()|' \
//	  go/cmd/doorman/doorman_server.go
//	go build -mod=mod -o doorman ./go/cmd/doorman
//
// Its grpc-go is the one capacityd is built with (v1.83.2); its messages are the generated code
// of 2016 (protobuf API v1), which today's protobuf runtime serves through
// its reflection-based path for legacy messages.
package capacity
