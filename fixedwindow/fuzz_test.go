package fixedwindow_test

import (
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/throttletest"
)

// model is a plain reference fixed window, written for clarity, not speed.
type model struct {
	limit, window int64
	anchored      bool
	start, count  int64 // the current window [start, start+window) and its count
}

func (m *model) allow(now, n int64) throttle.Decision {
	if m.anchored {
		if m.count == 0 || now >= m.start+m.window {
			m.start, m.count = now, 0
		}
	} else if s := now - now%m.window; s != m.start {
		m.start, m.count = s, 0
	}
	end := time.Duration(m.start + m.window - now)
	d := throttle.Decision{Limit: int(m.limit), ResetAfter: end}
	if m.count+n > m.limit {
		d.Remaining, d.RetryAfter = int(m.limit-m.count), end
		return d
	}
	m.count += n
	d.Allowed, d.Remaining = true, int(m.limit-m.count)
	return d
}

// FuzzBound plays a random trace on a Window and checks every decision
// against the model, that no aligned window admits more than limit, and
// that no interval of one window length admits more than 2·limit (the
// documented weakness, and no worse).
func FuzzBound(f *testing.F) {
	f.Add(uint8(3), uint16(100), false, []byte{0, 1, 0, 1, 0, 1, 0, 1, 99, 1, 1, 1, 0, 1, 0, 1})
	f.Add(uint8(5), uint16(7), true, []byte{3, 2, 3, 5, 1, 1, 9, 4, 0, 5, 200, 1})
	f.Add(uint8(1), uint16(1), false, []byte{0, 1, 1, 1, 0, 1, 2, 1})
	f.Fuzz(func(t *testing.T, limit8 uint8, window16 uint16, anchored bool, trace []byte) {
		limit, win := int64(limit8%64)+1, int64(window16%5000)+1
		trace = trace[:min(len(trace), 1024)] // bounded run time per input
		clk := throttletest.NewClock()
		clk.Advance(time.Duration(window16)) // any phase
		ctor := fixedwindow.NewWindow
		if anchored {
			ctor = fixedwindow.NewAnchoredWindow
		}
		w, err := ctor(int(limit), time.Duration(win), throttle.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		m := &model{limit: limit, window: win, anchored: anchored, start: -1}
		type adm struct{ at, n int64 }
		var log []adm
		perWindow := map[int64]int64{}
		for i := 0; i+1 < len(trace); i += 2 {
			clk.Advance(time.Duration(int64(trace[i]) * win / 64))
			now, n := clk.Now().UnixNano(), int64(trace[i+1])%limit+1
			got, err := w.AllowN(int(n))
			if err != nil {
				t.Fatal(err)
			}
			if want := m.allow(now, n); got != want {
				t.Fatalf("step %d at %d, n=%d: got %+v, want %+v", i/2, now, n, got, want)
			}
			if !got.Allowed {
				continue
			}
			log = append(log, adm{now, n})
			if !anchored {
				if perWindow[now/win] += n; perWindow[now/win] > limit {
					t.Fatalf("aligned window %d admitted %d > %d", now/win, perWindow[now/win], limit)
				}
			}
			var inWindow int64 // admitted in (now-win, now]
			for j := len(log) - 1; j >= 0 && log[j].at > now-win; j-- {
				inWindow += log[j].n
			}
			if inWindow > 2*limit {
				t.Fatalf("admitted %d within one window length, above 2·limit", inWindow)
			}
		}
	})
}
