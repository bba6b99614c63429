package slidingwindow_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/slidingwindow"
)

var bg = context.Background()

// form is a weighted window (slots 0) or a slotted one.
type form struct {
	limit  int
	window time.Duration
	slots  int
}

func (f form) window1(tb testing.TB) *slidingwindow.Window {
	return limitertest.New(tb, limitertest.Slotted(f.slots, slidingwindow.NewWindow, slidingwindow.NewSlottedWindow), f.limit, f.window)
}

func (f form) keyed(tb testing.TB) *slidingwindow.Limiter {
	return limitertest.New(tb, limitertest.Slotted(f.slots, slidingwindow.New, slidingwindow.NewSlotted), f.limit, f.window)
}
