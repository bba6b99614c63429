module github.com/throttlekit/throttle/distributed/capacity

go 1.26.0

require (
	github.com/throttlekit/throttle v0.0.0
	go.uber.org/goleak v1.3.0
)

replace github.com/throttlekit/throttle => ../..
