package slidingwindow_test

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
)

// model is a plain reference for both forms, written for clarity: it keeps
// the count of every window (weighted) or slot (slotted) and decides by
// the definition, with brute-force RetryAfter. Values are small enough
// for int64 (window ≤ 400 ns, limit ≤ 64).
type model struct {
	limit, window, slots int64
	counts               map[int64]int64 // by window or slot index
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// fits reports whether n more units fit at now, and the units a Decision
// reports as remaining if they do not.
func (m *model) fits(now, n int64) (bool, int64) {
	if m.slots == 0 {
		W := m.window
		i := floorDiv(now, W)
		e := now - i*W
		prev, cur := m.counts[i-1], m.counts[i]
		// prev·(W-e)/W + cur + n ≤ limit, times W.
		ok := prev*(W-e)+(cur+n)*W <= m.limit*W
		// Remaining: the largest r with prev·(W-e) + (cur+r)·W ≤ limit·W.
		rem := (m.limit*W-prev*(W-e))/W - cur // the numerator is ≥ 0
		return ok, max(rem, 0)
	}
	s := m.window / m.slots
	j := floorDiv(now, s)
	var sum int64
	for x := j - m.slots + 1; x <= j; x++ {
		sum += m.counts[x]
	}
	return sum+n <= m.limit, max(m.limit-sum, 0)
}

func (m *model) allow(now, n int64) throttle.Decision {
	d := throttle.Decision{Limit: int(m.limit)}
	ok, rem := m.fits(now, n)
	if ok {
		m.counts[floorDiv(now, m.unit())] += n
		_, rem = m.fits(now, 0)
		d.Allowed = true
	} else {
		// The weighted estimate changes every nanosecond: try each. The
		// slotted sum changes only when a slot starts.
		t := now + 1
		for ok, _ := m.fits(t, n); !ok; ok, _ = m.fits(t, n) {
			t = m.next(t)
		}
		d.RetryAfter = time.Duration(t - now)
	}
	d.Remaining = int(rem)
	// Both forms are empty again only from the start of a window or slot.
	t := now
	for _, free := m.fits(t, 0); free != m.limit; _, free = m.fits(t, 0) {
		t = m.unitStart(t + m.unit())
	}
	d.ResetAfter = time.Duration(t - now)
	return d
}

func (m *model) unit() int64 {
	if m.slots == 0 {
		return m.window
	}
	return m.window / m.slots
}

func (m *model) unitStart(t int64) int64 { return floorDiv(t, m.unit()) * m.unit() }

func (m *model) next(t int64) int64 {
	if m.slots == 0 {
		return t + 1
	}
	return m.unitStart(t + m.unit())
}

// FuzzBound plays a random trace on a Window of either form, checks each
// decision against the model, and checks the documented bounds against an
// exact sliding log of the admitted units:
//
//   - weighted: each aligned window ≤ limit; at each admission, the log
//     count C over (t-W, t] obeys C+n ≤ limit + prev·e/W; at each denial,
//     C+n > limit - prev·(W-e)/W; any W-interval ≤ 2·limit-1;
//   - slotted: at each admission, the log over (t-(W-W/k), t] holds at
//     most limit; at each denial, the log over (t-W, t] plus n exceeds
//     limit (the ring never refuses what a W-log would take).
func FuzzBound(f *testing.F) {
	f.Add(uint8(3), uint16(100), uint8(0), []byte{0, 1, 0, 1, 0, 1, 0, 1, 99, 1, 1, 1, 0, 1, 0, 1})
	f.Add(uint8(5), uint16(60), uint8(4), []byte{3, 2, 3, 5, 1, 1, 9, 4, 0, 5, 200, 1, 30, 2, 30, 3})
	f.Add(uint8(1), uint16(9), uint8(3), []byte{0, 1, 1, 1, 0, 1, 2, 1})
	f.Add(uint8(9), uint16(1000), uint8(0), []byte{63, 9, 1, 0, 62, 9, 0, 9})
	f.Fuzz(fuzzBody)
}

func fuzzBody(t *testing.T, limit8 uint8, window16 uint16, slots8 uint8, trace []byte) {
	limit, slots := int64(limit8%64)+1, int64(slots8%12)
	win := int64(window16%400) + 1
	if slots > 0 {
		win = (win + slots - 1) / slots * slots // a whole number of slots
	}
	trace = trace[:min(len(trace), 1024)] // bounded run time per input
	clk := throttletest.NewClock()
	clk.Advance(time.Duration(window16)) // any phase
	var w *slidingwindow.Window
	var err error
	if slots == 0 {
		w, err = slidingwindow.NewWindow(int(limit), time.Duration(win), throttle.WithClock(clk))
	} else {
		w, err = slidingwindow.NewSlottedWindow(int(limit), time.Duration(win), int(slots), throttle.WithClock(clk))
	}
	if err != nil {
		t.Fatal(err)
	}
	m := &model{limit: limit, window: win, slots: slots, counts: map[int64]int64{}}
	type adm struct{ at, n int64 }
	var log []adm
	logCount := func(from, to int64) (c int64) { // admitted in (from, to]
		for j := len(log) - 1; j >= 0 && log[j].at > from; j-- {
			if log[j].at <= to {
				c += log[j].n
			}
		}
		return c
	}
	for i := 0; i+1 < len(trace); i += 2 {
		clk.Advance(time.Duration(int64(trace[i]) * win / 32))
		now, n := clk.Now().UnixNano(), int64(trace[i+1])%limit+1
		got, err := w.AllowN(int(n))
		if err != nil {
			t.Fatal(err)
		}
		if want := m.allow(now, n); got != want {
			t.Fatalf("step %d at %d, n=%d: got %+v, want %+v", i/2, now, n, got, want)
		}
		C := logCount(now-win, now)
		if slots == 0 {
			idx := floorDiv(now, win)
			e := now - idx*win
			prev := m.counts[idx-1]
			if got.Allowed {
				if (C+n)*win > limit*win+prev*e {
					t.Fatalf("admitted with log count %d + %d above limit + prev·e/W = %d + %d·%d/%d", C, n, limit, prev, e, win)
				}
				if m.counts[idx] > limit {
					t.Fatalf("window %d holds %d", idx, m.counts[idx])
				}
			} else if (C+n)*win <= limit*win-prev*(win-e) {
				t.Fatalf("denied with log count %d + %d within limit - prev·(W-e)/W", C, n)
			}
		} else {
			if got.Allowed && logCount(now-(win-win/slots), now)+n > limit {
				t.Fatalf("admitted: more than limit in a span of W - W/k")
			}
			if !got.Allowed && C+n <= limit {
				t.Fatalf("denied with %d + %d in the last W: an exact log would admit", C, n)
			}
		}
		if got.Allowed {
			log = append(log, adm{now, n})
			if slots == 0 && logCount(now-win, now) > 2*limit-1 {
				t.Fatalf("more than 2·limit-1 in one window length")
			}
		}
	}
}
