package redislimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/redistest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestLongKeys: Redis takes keys of up to 512 MB, so a limiter whose
// WithMaxKeyLen allows 1 MiB decides on such keys (a bucket, and the
// sliding log, whose keys carry a hash tag), each a key of its own; a key
// over WithMaxKeyLen is refused with ErrInvalid, never ErrUnavailable.
func TestLongKeys(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	opts := []Option{WithPrefix(uniquePrefix()), WithTimeout(5 * time.Second), WithOptions(throttle.WithClock(throttletest.NewClock()), throttle.WithMaxKeyLen(1<<20))}
	tb, err := NewTokenBucket(c, throttle.PerSecond(1), 1, opts...)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := NewSlidingLog(c, 1, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("{k}", (1<<20)/3)
	for _, l := range []throttle.Limiter{tb, sl} {
		for _, want := range []bool{true, false} {
			for _, k := range []string{long + "1", long + "2"} {
				if d, err := l.Allow(context.Background(), k, 1); err != nil || d.Allowed != want {
					t.Fatalf("%T: Allow(key of %d bytes) = %+v, %v; want allowed %v", l, len(k), d, err, want)
				}
			}
		}
		if _, err := l.Allow(context.Background(), long+long, 1); !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("%T: a key over WithMaxKeyLen: %v, want ErrInvalid", l, err)
		}
	}
}
