package unsent

import (
	"context"
	"errors"
	"testing"

	"github.com/throttlekit/throttle"
)

func TestMark(t *testing.T) {
	if Mark(nil) != nil || Is(nil) {
		t.Fatal("nil")
	}
	err := Mark(context.DeadlineExceeded)
	if !Is(err) || !errors.Is(err, context.DeadlineExceeded) || err.Error() != context.DeadlineExceeded.Error() {
		t.Fatalf("Mark: %v", err)
	}
	le := &throttle.LimitedError{Key: "k"}
	if Mark(le) != error(le) || !Is(le) || Is(errors.New("x")) {
		t.Fatal("a LimitedError is unsent as it is")
	}
}

// holder is a Holder whose release records whether its context was
// cancelled at release.
type holder struct {
	throttle.Limiter
	cancelled *bool
}

func (h holder) TryHold(ctx context.Context, _ string, _ int) (throttle.Decision, func(), error) {
	return throttle.Decision{Allowed: true}, func() { *h.cancelled = ctx.Err() != nil }, nil
}

func (h holder) Hold(ctx context.Context, k string, n int) (func(), error) {
	_, r, err := h.TryHold(ctx, k, n)
	return r, err
}

// TestHold: the hold's context is cancelled before the release of an
// unsent request only.
func TestHold(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{{nil, false}, {errors.New("upstream"), false}, {Err, true}, {&throttle.LimitedError{}, true}} {
		var cancelled bool
		l := holder{Limiter: throttle.LimiterFunc(nil), cancelled: &cancelled}
		ctx, h := Begin(context.Background(), l)
		_, release, _ := l.TryHold(ctx, "k", 1)
		h.End(release, tc.err)
		if cancelled != tc.want || ctx.Err() == nil {
			t.Errorf("%v: cancelled at release %v, want %v; cancelled after %v", tc.err, cancelled, tc.want, ctx.Err())
		}
	}
	called := false
	ctx, h := Begin(context.Background(), throttle.LimiterFunc(nil))
	h.End(func() { called = true }, Err)
	if !called || ctx != context.Background() {
		t.Error("a limiter that holds nothing: ctx itself, and release called")
	}
}
