package breaker

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

func TestBreaker(t *testing.T) {
	var b Breaker
	if err := b.Init(2, 10, 40); err != nil {
		t.Fatal(err)
	}
	at := int64(100)
	if b.Failure(at, false) {
		t.Fatal("opened after 1 failure of 2")
	}
	if _, ok := b.Allow(at); !ok {
		t.Fatal("refused after 1 failure of 2")
	}
	if !b.Failure(at, false) || b.RetryAfter(at) != 10 {
		t.Fatalf("2 failures: want open for 10, RetryAfter %v", b.RetryAfter(at))
	}
	if _, ok := b.Allow(at + 9); ok {
		t.Fatal("allowed during the cooldown")
	}
	probe, ok := b.Allow(at + 10)
	if !probe || !ok {
		t.Fatal("no probe after the cooldown")
	}
	if _, ok := b.Allow(at + 10); ok {
		t.Fatal("two probes at once")
	}
	b.Release(probe) // the probe's caller gave up: another may probe
	if probe, ok = b.Allow(at + 10); !probe || !ok {
		t.Fatal("no probe after a released one")
	}
	// Failed probes double the cooldown up to the maximum.
	for i, want := range []time.Duration{20, 40, 40} {
		now := at + 10 + int64(i)*100
		if b.Failure(now, true) {
			t.Fatal("a failed probe reported as an opening")
		}
		if got := b.RetryAfter(now); got != want {
			t.Fatalf("failed probe %d: cooldown %v, want %v", i+1, got, want)
		}
		if probe, ok = b.Allow(now + int64(want)); !probe || !ok {
			t.Fatalf("failed probe %d: no probe after the cooldown", i+1)
		}
	}
	if !b.Success(true) || b.Open() {
		t.Fatal("a successful probe did not close the breaker")
	}
	for range 2 {
		if probe, ok := b.Allow(at + 1000); probe || !ok {
			t.Fatal("closed breaker refused or probed")
		}
	}
	// After closing, the next opening starts from the base cooldown.
	b.Failure(2000, false)
	if b.Failure(2000, false); b.RetryAfter(2000) != 10 {
		t.Fatalf("cooldown after a success = %v, want 10", b.RetryAfter(2000))
	}

	var off Breaker // the zero Breaker never opens
	for range 10 {
		off.Failure(0, false)
	}
	if _, ok := off.Allow(0); !ok {
		t.Fatal("disabled breaker opened")
	}
	if _, err := NewBreaker(-1, time.Second, 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("NewBreaker(-1): %v", err)
	}
	if _, err := NewBreaker(3, 0, 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("NewBreaker(3, 0): %v", err)
	}
}

// The failures of one outage open the breaker once, for the base
// cooldown: only failed probes lengthen it.
func TestBreakerConcurrentFailuresOpenOnce(t *testing.T) {
	var b Breaker
	if err := b.Init(3, 100, 10_000); err != nil {
		t.Fatal(err)
	}
	opened := 0
	for range 64 { // 64 calls in flight when the store died
		if b.Failure(1000, false) {
			opened++
		}
	}
	if opened != 1 || b.RetryAfter(1000) != 100 {
		t.Fatalf("64 failures: opened %d times, cooldown %v; want once, 100", opened, b.RetryAfter(1000))
	}
	probe, ok := b.Allow(1100)
	if !probe || !ok {
		t.Fatal("no probe")
	}
	b.Failure(1100, false) // a straggler of the outage, not the probe
	b.Failure(1100, true)
	if got := b.RetryAfter(1100); got != 200 {
		t.Fatalf("after a failed probe: cooldown %v, want 200", got)
	}
}

// A success of a call begun before the breaker opened does not close it:
// only the probe's does.
func TestBreakerEarlierSuccessDoesNotClose(t *testing.T) {
	var b Breaker
	if err := b.Init(2, 100, 100); err != nil {
		t.Fatal(err)
	}
	slow, ok := b.Allow(0) // begun while closed
	if slow || !ok {
		t.Fatal("closed breaker refused")
	}
	b.Failure(10, false)
	b.Failure(10, false)
	if b.Success(slow) || !b.Open() {
		t.Fatal("a success begun before the opening closed the breaker")
	}
	if _, ok := b.Allow(50); ok {
		t.Fatal("allowed during the cooldown")
	}
	probe, _ := b.Allow(110)
	if !b.Success(probe) || b.Open() {
		t.Fatal("the probe's success did not close the breaker")
	}
}
