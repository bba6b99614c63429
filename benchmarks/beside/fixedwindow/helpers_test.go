package fixedwindow_test

import (
	"context"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
)

var bg = context.Background()

// kinds are the two kinds of window, with their constructors: aligned to
// the clock, and anchored to a key's first request.
var kinds = []struct {
	name    string
	window  func(int, time.Duration, ...throttle.Option) (*fixedwindow.Window, error)
	limiter func(int, time.Duration, ...throttle.Option) (*fixedwindow.Limiter, error)
}{
	{"aligned", fixedwindow.NewWindow, fixedwindow.New},
	{"anchored", fixedwindow.NewAnchoredWindow, fixedwindow.NewAnchored},
}
