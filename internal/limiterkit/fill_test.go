package limiterkit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limiterkit"
)

// TestFillSetsEveryField fills a Decision that holds other values: every
// field must be overwritten.
func TestFillSetsEveryField(t *testing.T) {
	d := throttle.Decision{Allowed: true, Limit: 9, Remaining: 9, RetryAfter: 9, ResetAfter: 9}
	limiterkit.Fill(&d, false, 10, 0, int64(time.Second), int64(time.Minute))
	want := throttle.Decision{Limit: 10, RetryAfter: time.Second, ResetAfter: time.Minute}
	if d != want {
		t.Fatalf("Fill: %+v, want %+v", d, want)
	}
}

// myLimiter admits every other call: a minimal Allow that fills its named
// result in place.
type myLimiter struct{ calls int }

func (l *myLimiter) Allow(n int) (d throttle.Decision, err error) {
	l.calls++
	if l.calls%2 == 0 {
		limiterkit.Fill(&d, false, 1, 0, int64(time.Second), int64(time.Second))
		return d, nil
	}
	limiterkit.Fill(&d, true, 1, 0, 0, int64(time.Second))
	return d, nil
}

func ExampleFill() {
	var l myLimiter
	for range 2 {
		d, _ := l.Allow(1)
		fmt.Println(d.Allowed, d.RetryAfter)
	}
	// Output:
	// true 0s
	// false 1s
}
