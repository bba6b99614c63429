package fixedwindow_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle/fixedwindow"
)

var bg = context.Background()

func mustWindow(tb testing.TB, anchored bool, limit int, window time.Duration) *fixedwindow.Window {
	ctor := fixedwindow.NewWindow
	if anchored {
		ctor = fixedwindow.NewAnchoredWindow
	}
	w, err := ctor(limit, window)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

func mustLimiter(tb testing.TB, anchored bool, limit int, window time.Duration) *fixedwindow.Limiter {
	ctor := fixedwindow.New
	if anchored {
		ctor = fixedwindow.NewAnchored
	}
	l, err := ctor(limit, window)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
