package redislimit

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	var b breaker
	b.init(2, time.Hour)
	b.failure()
	if !b.allow() {
		t.Fatal("open after 1 failure of 2")
	}
	b.failure()
	if b.allow() || b.retryAfter() <= 0 {
		t.Fatalf("closed after 2 failures (retryAfter %v)", b.retryAfter())
	}

	b.init(1, time.Nanosecond) // cooldown over at once: half-open
	b.success()
	b.failure()
	for b.openUntil.Load() > mono() {
	}
	if !b.allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.allow() {
		t.Fatal("two probes at once")
	}
	b.release() // the probe's caller gave up: another may probe
	if !b.allow() {
		t.Fatal("no probe after a released one")
	}
	b.success()
	for range 2 {
		if !b.allow() {
			t.Fatal("breaker not closed after a successful probe")
		}
	}

	var off breaker
	off.init(0, 0)
	for range 10 {
		off.failure()
	}
	if !off.allow() {
		t.Fatal("disabled breaker opened")
	}
}
