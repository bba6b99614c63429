package slidingwindow_test

import (
	"context"
	"testing"
	"time"

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
	w, err := slidingwindow.NewSlottedWindow(f.limit, f.window, f.slots)
	if f.slots == 0 {
		w, err = slidingwindow.NewWindow(f.limit, f.window)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

func (f form) keyed(tb testing.TB) *slidingwindow.Limiter {
	l, err := slidingwindow.NewSlotted(f.limit, f.window, f.slots)
	if f.slots == 0 {
		l, err = slidingwindow.New(f.limit, f.window)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
