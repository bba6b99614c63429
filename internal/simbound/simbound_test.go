package simbound

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle/internal/faultsim"
)

const s = time.Second

func TestAtMergesOverlaps(t *testing.T) {
	eps := []Episode{
		{Kind: faultsim.Cut, From: 1 * s, To: 4 * s, Count: 1},
		{Kind: faultsim.Loss, From: 3 * s, To: 6 * s, Count: 1},
		{Kind: faultsim.Crash, From: 8 * s, To: 9 * s, Count: 1, Restart: true},
		{Kind: faultsim.Config, From: 2 * s, To: 20 * s, Count: 1},
	}
	w := At(eps, 2*s, 10*s, []time.Duration{0, 0}, []time.Duration{0, 500 * time.Millisecond})
	switch {
	case w.D != 8*s || w.DC != 8*s+500*time.Millisecond:
		t.Errorf("D %v, DC %v", w.D, w.DC)
	case w.Overlap != 5*s: // [2,6] and [8,9]
		t.Errorf("overlap %v, want 5s", w.Overlap)
	case w.Episodes != 3 || w.Restarts != 1 || w.Since != 3:
		t.Errorf("episodes %d, restarts %d, since %d", w.Episodes, w.Restarts, w.Since)
	case w.Configs != 1 || w.ConfigOverlap != 8*s:
		t.Errorf("configs %d for %v", w.Configs, w.ConfigOverlap)
	}
	// An episode that ended before the window still counts in Since.
	if w := At(eps, 7*s, 7500*time.Millisecond, nil, nil); w.Episodes != 0 || w.Configs != 1 || w.Since != 2 {
		t.Errorf("window after the loss: episodes %d, configs %d, since %d", w.Episodes, w.Configs, w.Since)
	}
}

func TestBounds(t *testing.T) {
	p := Params{N: 3, Rate: 5, Burst: 20, Lag: 200 * time.Millisecond}
	healthy := Window{D: 2 * s, DC: 2 * s}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if got := Owner(p, healthy); !near(got, 30) {
		t.Errorf("healthy owner bound %v, want burst + rate x 2s = 30", got)
	}
	// One cut over the whole window: two fallback buckets of 6 + 5/3 x 2,
	// and the owner's own fallback burst of 6.
	cut := Window{D: 2 * s, DC: 2 * s, Overlap: 2 * s, Episodes: 1, Since: 1}
	if got, want := Owner(p, cut), 30+2*(6+10.0/3)+6; !near(got, want) {
		t.Errorf("owner bound under a cut %v, want %v", got, want)
	}
	if got := AllToAll(p, healthy); !near(got, 3*20+10+2*1) {
		t.Errorf("healthy all-to-all bound %v", got)
	}
	if got := Capped(p, healthy); !near(got, 20+10+2) {
		t.Errorf("capped bound %v", got)
	}
	if got := Restart(p, s, 0); !near(got, 6+1+5) {
		t.Errorf("restart bound %v", got)
	}
}

func TestConfigEpisodes(t *testing.T) {
	// Value 1 among 3: member 1 leaves member 2 out (ConfigPair).
	if u, v := ConfigPair(faultsim.Event{Value: 1}, 3); u != 1 || v != 2 {
		t.Fatalf("pair %d, %d", u, v)
	}
	sched := faultsim.Schedule{Events: []faultsim.Event{
		{Kind: faultsim.Config, At: 1 * s, Value: 1},           // 1 leaves 2 out...
		{Kind: faultsim.Config, At: 3 * s, Value: 1},           // ...and takes it back
		{Kind: faultsim.Config, At: 5 * s, Value: 1},           // leaves it out again...
		{Kind: faultsim.Crash, At: 6 * s, Dur: 2 * s, From: 1}, // ...until it restarts
		{Kind: faultsim.Config, At: 9 * s, Value: 3},           // 0 leaves 2 out to the end
	}}
	eps := ConfigEpisodes(sched, 3, 20*s, 0)
	want := [][2]time.Duration{{1 * s, 3 * s}, {5 * s, 8 * s}, {9 * s, 20 * s}}
	if len(eps) != len(want) {
		t.Fatalf("episodes %v", eps)
	}
	for i, e := range eps {
		if e.From != want[i][0] || e.To != want[i][1] {
			t.Errorf("episode %d: [%v, %v], want %v", i, e.From, e.To, want[i])
		}
	}
}

func TestSubAndRateChange(t *testing.T) {
	eps := []Episode{{Kind: faultsim.Cut, From: 1 * s, To: 4 * s, Count: 1}}
	w := At(eps, 0, 10*s, []time.Duration{0}, []time.Duration{time.Second})
	sub, ok := Sub(w, eps, 3*s, 20*s)
	switch {
	case !ok || sub.T0 != 3*s || sub.T != 10*s:
		t.Fatalf("sub %v-%v, ok %v", sub.T0, sub.T, ok)
	case sub.DC != 8*s || sub.Overlap != 1*s || sub.Episodes != 1:
		t.Errorf("sub: clock %v (want 8s: the window's second of skew kept), overlap %v, episodes %d", sub.DC, sub.Overlap, sub.Episodes)
	}
	if _, ok := Sub(w, eps, 10*s, 12*s); ok {
		t.Error("a limit in force after the window overlaps it")
	}
	rate := faultsim.Event{Kind: faultsim.Config, Value: 1<<63 | 7}
	sched := faultsim.Schedule{Events: []faultsim.Event{rate, {Kind: faultsim.Config, Value: 7}}}
	if !RateChange(rate) || RateChange(sched.Events[1]) || len(PeerChanges(sched).Events) != 1 || len(sched.Events) != 2 {
		t.Error("RateChange / PeerChanges")
	}
}

// A window's clock advance counts what a clock read before it was
// stepped back: what it admitted then is not taken back.
func TestSeriesAdvanceBeforeStepBack(t *testing.T) {
	series := NewSeries([]string{"a"})
	var dc time.Duration
	bound := func(w Window) float64 {
		if w.T0 == 0 {
			dc = w.DC
		}
		return 100
	}
	for i, off := range []time.Duration{0, s, -s} { // stepped 1 s forward, then 2 s back
		series.Add(time.Duration(i)*s, []int64{0}, []time.Duration{off}, "b", nil, bound)
	}
	if dc < 3*s {
		t.Errorf("clock advance over [0, 2s] = %v, want at least 3s (the clock read 2s at 1s, and ran a second more before the step back)", dc)
	}
}

// A Tally checks every window since an earlier sample.
func TestTally(t *testing.T) {
	ta := NewTally(Run{Keys: []string{"a"}, KeyIdx: map[string]int{"a": 0}})
	bound := func(Window) float64 { return 2 }
	for i, admits := range []int{0, 2, 1} {
		for range admits {
			ta.Admit("a")
		}
		err := ta.Check(time.Duration(i)*time.Second, nil, "over", bound)
		if (err != nil) != (i == 2) {
			t.Fatalf("sample %d: %v, want a violation only once 3 are admitted", i, err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "over:") {
			t.Errorf("violation %q, want class over", err)
		}
	}
}
