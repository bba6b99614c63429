package fixedwindow

// Bounds, for the tests of the package's API.
const (
	MaxLimit  = maxLimit
	MaxWindow = maxWindow
)
