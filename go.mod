module github.com/throttlekit/throttle

go 1.25
