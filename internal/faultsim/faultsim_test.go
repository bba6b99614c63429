package faultsim

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var testSpec = Spec{Name: "Test", Procs: 5, Len: 30 * time.Second, Sample: 100 * time.Millisecond,
	Kinds: AllKinds(), MaxEvents: 12}

func TestGenerateDeterministic(t *testing.T) {
	for seed := range uint64(50) {
		a, b := Generate(testSpec, seed), Generate(testSpec, seed)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two schedules:\n%v\n%v", seed, a, b)
		}
	}
	if reflect.DeepEqual(Generate(testSpec, 1).Events, Generate(testSpec, 2).Events) {
		t.Fatal("seeds 1 and 2 gave the same events")
	}
}

// TestGenerateCovers checks, over many seeds, that every kind and load is
// drawn, that swarm testing leaves kinds out, and that every event is
// well-formed.
func TestGenerateCovers(t *testing.T) {
	var kinds [NumKinds]int
	var loads [NumLoads]int
	partial := 0
	for seed := range uint64(1000) {
		s := Generate(testSpec, seed)
		loads[s.Load]++
		if len(s.Kinds) < len(testSpec.Kinds) {
			partial++
		}
		if len(s.Events) == 0 || len(s.Events) > testSpec.MaxEvents {
			t.Fatalf("seed %d: %d events", seed, len(s.Events))
		}
		if !slices.IsSortedFunc(s.Events, func(a, b Event) int { return int(a.At - b.At) }) {
			t.Fatalf("seed %d: events not sorted: %v", seed, s)
		}
		for _, e := range s.Events {
			kinds[e.Kind]++
			if err := wellFormed(e, s); err != nil {
				t.Fatalf("seed %d: %v: %v", seed, e, err)
			}
		}
		checkDowntimes(t, s)
	}
	for k, n := range kinds {
		if n == 0 {
			t.Errorf("kind %v never drawn in 1000 seeds", Kind(k))
		}
	}
	for l, n := range loads {
		if n == 0 {
			t.Errorf("load %v never drawn", Load(l))
		}
	}
	if partial < 900 {
		t.Errorf("only %d of 1000 seeds left kinds out", partial)
	}
}

func wellFormed(e Event, s Schedule) error {
	p := testSpec.Procs
	switch {
	case !slices.Contains(s.Kinds, e.Kind):
		return errors.New("kind not enabled")
	case e.At < 0 || e.At >= testSpec.Len:
		return errors.New("At outside the run")
	case e.From < 0 || e.From >= p:
		return errors.New("From out of range")
	case e.Kind.Link() && e.Kind != Spike && (e.To < 0 || e.To >= p || e.To == e.From):
		return errors.New("bad To")
	case e.Kind.Lasting() && e.Dur <= 0:
		return errors.New("no duration")
	case e.Kind == Skew && (e.P < -0.05 || e.P > 0.05):
		return errors.New("skew out of ±5%")
	case (e.Kind == Loss || e.Kind == Duplicate) && (e.P <= 0 || e.P > 1):
		return errors.New("probability out of (0, 1]")
	case (e.Kind == Delay || e.Kind == Spike || e.Kind == Flap) && e.D <= 0:
		return errors.New("no delay")
	}
	want := map[Kind]int{Cut: 2, Flap: 2, Split3: 3}[e.Kind]
	if want == 0 {
		return nil
	}
	if len(e.Groups) != want {
		return fmt.Errorf("%d groups", len(e.Groups))
	}
	var all []int
	for _, g := range e.Groups {
		if len(g) == 0 {
			return errors.New("empty group")
		}
		all = append(all, g...)
	}
	slices.Sort(all)
	if !slices.Equal(all, []int{0, 1, 2, 3, 4}) {
		return fmt.Errorf("groups cover %v", all)
	}
	return nil
}

// checkDowntimes fails when two pauses or crashes of one process overlap.
func checkDowntimes(t *testing.T, s Schedule) {
	t.Helper()
	for i, a := range s.Events {
		for _, b := range s.Events[i+1:] {
			down := func(e Event) bool { return e.Kind == Pause || e.Kind == Crash }
			if down(a) && down(b) && a.From == b.From && b.At < a.At+a.Dur {
				t.Fatalf("seed %d: overlapping downtimes %v and %v", s.Seed, a, b)
			}
		}
	}
}

// arrivals sends n messages from → to over net and returns when each
// arrived after it was sent (in order of arrival; several entries for a
// duplicate).
func arrivals(net *Net, from, to, n int) []time.Duration {
	got, _ := arrivalOrder(net, from, to, n)
	return got
}

// arrivalOrder is arrivals, and the numbers of the messages in the order
// they arrived.
func arrivalOrder(net *Net, from, to, n int) ([]time.Duration, []int) {
	var mu sync.Mutex
	var got []time.Duration
	var order []int
	for i := range n {
		sent := time.Now()
		net.Send(from, to, func() {
			mu.Lock()
			got, order = append(got, time.Since(sent)), append(order, i)
			mu.Unlock()
		})
	}
	time.Sleep(time.Minute)
	mu.Lock()
	defer mu.Unlock()
	return got, order
}

func TestNetLossDupDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := NewNet(7, 3, 5*time.Millisecond)
		defer net.Close()
		if got := arrivals(net, 0, 1, 10); len(got) != 10 || got[0].Truncate(time.Microsecond) != 5*time.Millisecond {
			t.Fatalf("no fault: %v", got)
		}
		loss := Event{Kind: Loss, From: 0, To: 1, P: 0.5}
		net.Start(loss)
		if n := len(arrivals(net, 0, 1, 1000)); n < 420 || n > 580 {
			t.Fatalf("loss 0.5: %d of 1000 delivered", n)
		}
		if n := len(arrivals(net, 1, 0, 100)); n != 100 {
			t.Fatalf("loss 0→1 lost %d messages 1→0", 100-n)
		}
		net.End(loss)
		dup := Event{Kind: Duplicate, From: 0, To: 1, P: 1}
		net.Start(dup)
		if n := len(arrivals(net, 0, 1, 100)); n != 200 {
			t.Fatalf("dup 1: %d deliveries of 100", n)
		}
		net.End(dup)
		delay := Event{Kind: Delay, From: 0, To: 1, D: 100 * time.Millisecond}
		net.Start(delay)
		got, order := arrivalOrder(net, 0, 1, 200)
		if slices.IsSorted(order) {
			t.Fatal("delay did not reorder")
		}
		for _, d := range got {
			if d < 5*time.Millisecond || d >= 105*time.Millisecond+time.Microsecond {
				t.Fatalf("delay %v outside [5ms, 105ms)", d)
			}
		}
		net.End(delay)
		spike := Event{Kind: Spike, From: 1, D: time.Second}
		net.Start(spike)
		if got := arrivals(net, 0, 1, 1); got[0].Truncate(time.Microsecond) != time.Second+5*time.Millisecond {
			t.Fatalf("spike: %v", got)
		}
		if got := arrivals(net, 0, 2, 1); got[0].Truncate(time.Microsecond) != 5*time.Millisecond {
			t.Fatalf("spike of 1 delayed 0→2: %v", got)
		}
	})
}

func TestNetPartitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := NewNet(7, 4, time.Millisecond)
		defer net.Close()
		reach := func(from, to int, want bool) {
			t.Helper()
			if got := net.Reachable(from, to); got != want {
				t.Fatalf("Reachable(%d, %d) = %v", from, to, got)
			}
			if n := len(arrivals(net, from, to, 3)); (n == 3) != want {
				t.Fatalf("%d → %d: %d of 3 delivered, want reachable %v", from, to, n, want)
			}
		}
		cut := Event{Kind: Cut, Groups: [][]int{{0, 1}, {2, 3}}}
		net.Start(cut)
		reach(0, 1, true)
		reach(0, 2, false)
		reach(3, 1, false)
		net.End(cut)
		reach(0, 2, true)
		one := Event{Kind: OneWay, From: 0, To: 1}
		net.Start(one)
		reach(0, 1, false)
		reach(1, 0, true)
		net.End(one)
		split := Event{Kind: Split3, Groups: [][]int{{0}, {1, 2}, {3}}}
		net.Start(split)
		reach(1, 2, true)
		reach(0, 3, false)
		reach(2, 3, false)
		net.End(split)
		net.SetUp(2, false)
		reach(0, 2, false)
		reach(2, 0, false)
		net.SetUp(2, true)
		reach(0, 2, true)
	})
}

func TestNetFlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := NewNet(7, 2, 0)
		defer net.Close()
		// The run's start is the Net's start: a flap at 0 toggles at
		// multiples of D from now.
		flap := Event{Kind: Flap, Groups: [][]int{{0}, {1}}, D: time.Second}
		net.Start(flap)
		for i := range 6 {
			if got, want := net.Reachable(0, 1), i%2 == 1; got != want {
				t.Fatalf("flap, second %d: reachable %v", i, got)
			}
			time.Sleep(time.Second)
		}
	})
}

// TestNetDeterministic checks that a link's losses come from (seed, link,
// message number) alone, not from the traffic on other links.
func TestNetDeterministic(t *testing.T) {
	pattern := func(seed uint64, noise bool) []time.Duration {
		var got []time.Duration
		synctest.Test(t, func(t *testing.T) {
			net := NewNet(seed, 3, time.Millisecond)
			defer net.Close()
			for _, e := range []Event{{Kind: Loss, From: 0, To: 1, P: 0.3}, {Kind: Delay, From: 0, To: 1, D: time.Second}} {
				net.Start(e)
			}
			if noise {
				arrivals(net, 2, 1, 50)
			}
			got = arrivals(net, 0, 1, 200)
		})
		return got
	}
	a := pattern(3, false)
	if b := pattern(3, true); !slices.Equal(a, b) {
		t.Fatal("traffic on another link changed link 0→1's draws")
	}
	if c := pattern(4, false); slices.Equal(a, c) {
		t.Fatal("seeds 3 and 4 drew the same")
	}
}

func TestClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewClock()
		t0 := time.Now()
		c.Step(-3 * time.Second)
		if got := c.Now().Sub(t0); got != -3*time.Second {
			t.Fatalf("after a step of -3s: %v", got)
		}
		c.SetSkew(0.05)
		time.Sleep(10 * time.Second)
		if got := c.Offset(); got != -3*time.Second+500*time.Millisecond {
			t.Fatalf("after 10s at +5%%: offset %v", got)
		}
		if got := time.Until(c.Monotonic().Now()); got != 500*time.Millisecond {
			t.Fatalf("monotonic after 10s at +5%%: offset %v", got)
		}
	})
}
