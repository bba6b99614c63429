module github.com/throttlekit/throttle/cmd/capacityd

go 1.25.0

replace (
	github.com/throttlekit/throttle => ../..
	github.com/throttlekit/throttle/distributed/capacity => ../../distributed/capacity
	github.com/throttlekit/throttle/distributed/capacity/etcdelection => ../../distributed/capacity/etcdelection
)

require (
	github.com/throttlekit/throttle v0.1.0
	github.com/throttlekit/throttle/distributed/capacity v0.1.0
	github.com/throttlekit/throttle/distributed/capacity/etcdelection v0.1.0
)

require (
	connectrpc.com/connect v1.19.1
	github.com/prometheus/client_golang v1.24.1
	go.etcd.io/etcd/client/v3 v3.6.14
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.27.0
	golang.org/x/net v0.57.0
	google.golang.org/grpc v1.82.1
	google.golang.org/protobuf v1.36.11
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.5.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.26.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.70.1 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	go.etcd.io/etcd/api/v3 v3.6.14 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.6.14 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260414002931-afd174a4e478 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260414002931-afd174a4e478 // indirect
)
