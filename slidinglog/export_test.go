package slidinglog

// Bounds, for the tests of the package's API.
const (
	MaxWindow = maxWindow
)
