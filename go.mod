module github.com/throttlekit/throttle

go 1.25.0

require (
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.22.0
)

require github.com/stretchr/testify v1.8.3 // indirect
