package deadline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestDeadlines checks the shared-channel deadlines, in virtual time (on
// a busy machine two calls on the real clock may fall in different
// ticks): a deadline exactly timeout ahead, Done closed at most one tick
// late, and ordinary contexts for cancellable parents.
func TestDeadlines(t *testing.T) { synctest.Test(t, testDeadlines) }

func testDeadlines(t *testing.T) {
	var d Shared
	d.Init(20 * time.Millisecond)
	start := time.Now()
	ctx, cancel := d.With(context.Background())
	after := time.Now()
	if cancel != nil {
		t.Fatal("background parent: want no cancel function")
	}
	if dl, ok := ctx.Deadline(); !ok || dl.Before(start.Add(20*time.Millisecond)) || dl.After(after.Add(20*time.Millisecond)) {
		t.Fatalf("Deadline = %v after the call, %v; want 20ms", dl.Sub(after), ok)
	}
	ctx2, _ := d.With(context.Background())
	if ctx2.Done() != ctx.Done() {
		t.Fatal("calls in one tick should share a channel")
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed")
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("Done after %v, before the deadline", el)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v", ctx.Err())
	}
	parent, stop := context.WithCancel(context.Background())
	c3, cancel3 := d.With(parent)
	if cancel3 == nil {
		t.Fatal("cancellable parent: want context.WithTimeout")
	}
	stop()
	<-c3.Done()
	cancel3()
}
