module github.com/throttlekit/throttle/distributed/capacity

go 1.25.0

replace github.com/throttlekit/throttle => ../..
