module github.com/throttlekit/throttle/cmd/throttled

go 1.25.0

replace (
	github.com/throttlekit/throttle => ../..
	github.com/throttlekit/throttle/distributed/gossip/gossipmember => ../../distributed/gossip/gossipmember
	github.com/throttlekit/throttle/distributed/redislimit => ../../distributed/redislimit
	github.com/throttlekit/throttle/extra/envoyrls => ../../extra/envoyrls
)

require (
	github.com/envoyproxy/go-control-plane/envoy v1.39.0
	github.com/hashicorp/memberlist v0.7.0
	github.com/throttlekit/throttle v0.1.0
	github.com/throttlekit/throttle/distributed/gossip/gossipmember v0.1.0
	github.com/throttlekit/throttle/extra/envoyrls v0.1.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.83.2
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.3 // indirect
	github.com/google/btree v1.1.3 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/hashicorp/go-immutable-radix v1.3.1 // indirect
	github.com/hashicorp/go-metrics v0.7.0 // indirect
	github.com/hashicorp/go-msgpack/v2 v2.1.5 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/hashicorp/go-sockaddr v1.0.7 // indirect
	github.com/hashicorp/golang-lru v1.0.2 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/miekg/dns v1.1.73 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/redis/go-redis/v9 v9.22.0 // indirect
	github.com/sean-/seed v0.0.0-20170313163322-e2103e2c3529 // indirect
	github.com/throttlekit/throttle/distributed/redislimit v0.1.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
