package leakybucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/bridge"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/throttletest"
)

var fuzzRates = []throttle.Rate{
	throttle.PerSecond(10),
	throttle.NewRate(7, time.Minute), // fractional interval
	throttle.NewRate(1, 6*time.Second),
	throttle.NewRate(2, 3),
	throttle.NewRate(int(bridge.MaxPerSecond), time.Second),
}

func fuzzStep(a byte) time.Duration {
	return time.Duration(a>>3) * []time.Duration{0, 1, time.Microsecond, time.Millisecond, 37 * time.Millisecond, time.Second, time.Minute, time.Hour}[a&7]
}

// FuzzMeter checks the definition of the meter on any sequence of (time
// step, n, debit): a request is admitted exactly when level + n <=
// capacity at that instant, and the level after it is what it was plus n.
func FuzzMeter(f *testing.F) {
	f.Add(uint8(0), uint8(3), []byte{0, 1, 0, 2, 9, 3, 0, 4, 200, 1})
	f.Add(uint8(1), uint8(0), []byte{0, 255, 13, 1, 7, 2})
	f.Fuzz(func(t *testing.T, ri, ci uint8, ops []byte) {
		clk := throttletest.NewClock()
		rate, capacity := fuzzRates[int(ri)%len(fuzzRates)], 1+int(ci%20)
		b, err := leakybucket.NewBucket(rate, capacity, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		for ; len(ops) >= 2; ops = ops[2:] {
			clk.Advance(fuzzStep(ops[0]))
			level := b.Level()
			if ops[1] >= 240 { // debit
				if err := b.Debit(int64(ops[1] - 239)); err != nil {
					t.Fatal(err)
				}
				if got := b.Level(); got != level+int64(ops[1]-239) {
					t.Fatalf("Level after Debit(%d) from %d: %d", ops[1]-239, level, got)
				}
				continue
			}
			n := 1 + int(ops[1])%capacity
			d, err := b.AllowN(n)
			if err != nil {
				t.Fatal(err)
			}
			if fits := level+int64(n) <= int64(capacity); d.Allowed != fits {
				t.Fatalf("level %d + n %d, capacity %d: allowed %v", level, n, capacity, d.Allowed)
			}
			after := b.Level()
			switch {
			case d.Allowed && (after != level+int64(n) || d.Remaining != capacity-int(after)):
				t.Fatalf("admitted %d at level %d: level %d after, %+v", n, level, after, d)
			case !d.Allowed && (after != level || d.RetryAfter <= 0 || d.Remaining != max(0, capacity-int(level))):
				t.Fatalf("denied %d at level %d: level %d after, %+v", n, level, after, d)
			}
		}
	})
}

// FuzzPacer checks the pacer on any sequence of (time step, calls): no
// delay exceeds maxWait, rejections book nothing, and the slots granted
// from any instant t0 on never start more often than slack + 1 +
// rate.Events(d) in [t0, t0+d].
func FuzzPacer(f *testing.F) {
	f.Add(uint8(0), uint8(2), uint8(30), []byte{0, 5, 3, 1, 60, 9, 0, 3})
	f.Add(uint8(3), uint8(0), uint8(0), []byte{7, 4, 0, 3})
	f.Fuzz(func(t *testing.T, ri, si, wi uint8, ops []byte) {
		clk := throttletest.NewClock()
		rate, slack := fuzzRates[int(ri)%len(fuzzRates)], int(si%8)
		maxWait := leakybucket.Unbounded
		if wi < 250 {
			maxWait = time.Duration(wi) * rate.Duration(1) / 4
		}
		p, err := leakybucket.NewPacer(rate, slack, maxWait, throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		start := clk.Now()
		var slots []time.Duration // start times of the granted slots, since start
		for ; len(ops) >= 2 && len(slots) < 1000; ops = ops[2:] {
			clk.Advance(fuzzStep(ops[0]))
			for range ops[1] % 16 {
				d, err := p.Reserve()
				switch {
				case errors.Is(err, throttle.ErrLimited):
					if d <= 0 {
						t.Fatalf("rejected with delay %v", d)
					}
					continue
				case err != nil:
					t.Fatal(err)
				case d < 0 || d > maxWait:
					t.Fatalf("delay %v outside [0, %v]", d, maxWait)
				}
				slots = append(slots, clk.Now().Sub(start)+d)
			}
		}
		// Slots are granted in arrival order, and every window starting
		// at a granted slot holds at most slack + 1 + Events(length).
		for i := 1; i < len(slots); i++ {
			if slots[i] < slots[i-1] {
				t.Fatalf("slots out of order: %v", slots)
			}
		}
		for i := range slots {
			for j := i; j < len(slots); j++ {
				if int64(j-i+1) > int64(slack)+1+rate.Events(slots[j]-slots[i]) {
					t.Fatalf("%d slots in %v (slack %d, %v): %v", j-i+1, slots[j]-slots[i], slack, rate, slots[i:j+1])
				}
			}
		}
	})
}
