module github.com/throttlekit/throttle/distributed/capacity

go 1.25.0

require (
	connectrpc.com/connect v1.19.1
	github.com/throttlekit/throttle v0.1.0
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.11
)

replace github.com/throttlekit/throttle => ../..
