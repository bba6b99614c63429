package slidinglog_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidinglog"
)

var bg = context.Background()

func mustLog(tb testing.TB, limit int, window time.Duration) *slidinglog.Log {
	l, err := slidinglog.NewLog(limit, window)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func mustNew(tb testing.TB, limit int, window time.Duration, opts ...throttle.Option) *slidinglog.Limiter {
	l, err := slidinglog.New(limit, window, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
