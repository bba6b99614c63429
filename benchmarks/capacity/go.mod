module github.com/throttlekit/throttle/benchmarks/capacity

go 1.25.0

replace (
	github.com/throttlekit/throttle => ../..
	github.com/throttlekit/throttle/distributed/capacity => ../../distributed/capacity
)

require (
	github.com/throttlekit/throttle v0.1.0
	github.com/throttlekit/throttle/distributed/capacity v0.1.0
	google.golang.org/grpc v1.82.1
	google.golang.org/protobuf v1.36.11
)

require (
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
