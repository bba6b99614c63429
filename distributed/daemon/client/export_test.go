package client

// Defaults the package's external tests check against.
const (
	DefaultFailures = defaultFailures
	MaxTagLen       = maxTagLen
	HardMaxTagLen   = hardMaxTagLen
)
