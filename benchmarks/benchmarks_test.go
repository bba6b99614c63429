package benchmarks

import (
	"flag"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var thorough = flag.Bool("thorough", false, "BenchmarkSpeed: include the 1M-key workloads")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// ulule's memory store stops its cleaner from a finalizer only.
		goleak.IgnoreTopFunction("github.com/ulule/limiter/v3/drivers/store/memory.(*cleaner).Run"),
		// aegis samples the CPU from goroutines its packages' init start.
		goleak.IgnoreAnyFunction("github.com/go-kratos/aegis/ratelimit/bbr.cpuproc"),
		goleak.IgnoreAnyFunction("github.com/go-kratos/aegis/internal/cpu.init.0.func1"),
	)
}

// BenchmarkSpeed runs every workload on every subject that supports it:
// go test -run '^$' -bench Speed -count 5 ./benchmarks | benchstat -
// (add -args -thorough for the 1M-key workloads).
func BenchmarkSpeed(b *testing.B) {
	ws := QuickWorkloads
	if *thorough {
		ws = ThoroughWorkloads
	}
	for _, w := range ws {
		for _, s := range Subjects() {
			if !w.Supports(s) {
				continue
			}
			b.Run(w.Slug+"/"+Slug(s.Name), func(b *testing.B) {
				in, err := Prepare(s, w.Keys, w.Denied)
				if err != nil {
					b.Fatal(err)
				}
				defer in.Close()
				in.Body(w)(b)
			})
		}
	}
}

func TestReferenceBucket(t *testing.T) {
	const L, W = 10, int64(time.Second)
	var b bucket
	for i := range L {
		if !b.take(0, 1, L, W) {
			t.Fatalf("take %d at 0 denied", i)
		}
	}
	if b.take(0, 1, L, W) {
		t.Fatal("take 11 at 0 admitted")
	}
	if b.take(W/L-1, 1, L, W) {
		t.Fatal("admitted 1 ns before a token is earned")
	}
	if !b.take(W/L, 1, L, W) {
		t.Fatal("denied when a token is earned")
	}
	// After a long idle the bucket is full again, not fuller.
	if !b.take(100*W, L, L, W) || b.take(100*W, 1, L, W) {
		t.Fatal("bucket not exactly full after idle")
	}
}

func TestMaxInWindow(t *testing.T) {
	ev := []Event{{At: 0, N: 1}, {At: 5, N: 2}, {At: 9, N: 1}, {At: 10, N: 4}, {At: 25, N: 1}}
	if got := maxInWindow(ev, 10); got != 7 { // [5, 15): 2+1+4
		t.Fatalf("maxInWindow = %d, want 7", got)
	}
	if got := maxInWindow(ev, 1); got != 4 {
		t.Fatalf("maxInWindow(1) = %d, want 4", got)
	}
	if got := maxInWindow(nil, 10); got != 0 {
		t.Fatalf("maxInWindow(nil) = %d", got)
	}
}

func TestTracesDeterministic(t *testing.T) {
	a, b := Traces(100, time.Second), Traces(100, time.Second)
	if len(a) != len(b) {
		t.Fatal("different trace counts")
	}
	for i := range a {
		if len(a[i].Arrivals) != len(b[i].Arrivals) {
			t.Fatalf("%s: %d vs %d arrivals", a[i].Name, len(a[i].Arrivals), len(b[i].Arrivals))
		}
		for j := range a[i].Arrivals {
			if a[i].Arrivals[j] != b[i].Arrivals[j] {
				t.Fatalf("%s: arrival %d differs", a[i].Name, j)
			}
			if j > 0 && a[i].Arrivals[j].At < a[i].Arrivals[j-1].At {
				t.Fatalf("%s: arrival %d out of order", a[i].Name, j)
			}
		}
	}
}

// Every subject admits the limit at once and then denies (on the wall
// clock for those without a clock: the window is long enough not to turn).
func TestSubjectsSmoke(t *testing.T) {
	for _, s := range Subjects() {
		t.Run(Slug(s.Name), func(t *testing.T) {
			t.Parallel()
			// The speed workloads' configurations are all accepted.
			for _, c := range []Config{allowConfig, keysConfig, denyConfig} {
				if s.SpeedConfig != nil {
					c = s.SpeedConfig(c)
				}
				l, err := s.Open(c)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.Allow(bg, "k", 1); err != nil {
					t.Fatal(err)
				}
				closeLimiter(l)
			}
			c := Config{Limit: 5, Window: time.Hour}
			l, err := s.Open(c)
			if err != nil {
				t.Fatal(err)
			}
			defer closeLimiter(l)
			if s.Blocks {
				if d, err := l.Allow(bg, "k", 1); err != nil || !d.Allowed {
					t.Fatalf("first Take: %v, %v", d, err)
				}
				return
			}
			for i := range c.Limit {
				if d, err := l.Allow(bg, "k", 1); err != nil || !d.Allowed {
					t.Fatalf("call %d: %+v, %v", i, d, err)
				}
			}
			if d, err := l.Allow(bg, "k", 1); err != nil || d.Allowed {
				t.Fatalf("call over the limit: %+v, %v", d, err)
			}
			if s.Keyed {
				if d, err := l.Allow(bg, "other", 1); err != nil || !d.Allowed {
					t.Fatalf("another key: %+v, %v", d, err)
				}
			}
		})
	}
}

// On virtual time the exact token buckets admit exactly the ideal on
// every trace, and the sliding log never more than the limit in a window.
func TestVirtualTraces(t *testing.T) {
	traces := Traces(20, time.Second)
	for _, name := range []string{"tokenbucket.Limiter", "x/time/rate", "throttled GCRA", "slidinglog.Limiter"} {
		s, ok := Lookup(name)
		if !ok {
			t.Fatalf("no subject %s", name)
		}
		for _, tr := range traces {
			if !Runs(s, tr) {
				continue
			}
			r, err := RunVirtual(s, tr)
			if err != nil {
				t.Fatal(err)
			}
			switch s.Algo {
			case "sliding log":
				if r.MaxInWindow > int64(tr.Limit) {
					t.Errorf("%s on %s: %d in a window, limit %d", name, tr.Name, r.MaxInWindow, tr.Limit)
				}
			default:
				if r.Admitted != r.Ideal {
					t.Errorf("%s on %s: admitted %d, ideal %d", name, tr.Name, r.Admitted, r.Ideal)
				}
			}
			if tr.Recovery && (math.IsNaN(r.Recovery) || r.Recovery <= 0) {
				t.Errorf("%s on %s: recovery %v", name, tr.Name, r.Recovery)
			}
		}
	}
}

func TestGuard(t *testing.T) {
	xr, _ := Lookup("x/time/rate")
	fast := Subject{Name: "fast", Ours: true}
	slow := Subject{Name: "slow", Ours: true}
	mk := func(s Subject, ns ...float64) SpeedResult {
		r := SpeedResult{Subject: s, Workload: Allow}
		for _, v := range ns {
			r.Samples = append(r.Samples, Sample{NsPerOp: v})
		}
		return r
	}
	noisy := Subject{Name: "noisy", Ours: true}
	// Six paired rounds: slow is slower in all six (sign test p = 1/64);
	// noisy in five, but its fastest sample is faster; unlucky in four
	// (p = 0.34), although both its ratios are above 1.
	unlucky := Subject{Name: "unlucky", Ours: true}
	res := []SpeedResult{mk(xr, 100, 200, 100, 100, 150, 150), mk(fast, 50, 100, 60, 50, 50, 50),
		mk(slow, 120, 240, 120, 120, 180, 180), mk(noisy, 90, 250, 120, 120, 180, 180), mk(unlucky, 130, 250, 130, 130, 120, 120)}
	g := Guard(res, 1.0)
	if len(g) != 4 {
		t.Fatalf("got %d guard rows", len(g))
	}
	if g[0].Fail || g[0].Ratio != 0.5 {
		t.Errorf("fast: %+v", g[0])
	}
	if !g[1].Fail || g[1].Ratio != 1.2 || g[1].MinRatio != 1.2 || g[1].Slower != 6 || g[1].P != 1.0/64 {
		t.Errorf("slow: %+v", g[1])
	}
	if g[2].Fail || g[2].Ratio != 1.2 || g[2].MinRatio != 0.9 || g[2].Slower != 5 {
		t.Errorf("noisy: %+v", g[2])
	}
	if g[3].Fail || g[3].Ratio <= 1 || g[3].MinRatio != 1.2 || g[3].Slower != 4 {
		t.Errorf("unlucky: %+v", g[3])
	}
}

func TestContention(t *testing.T) {
	s, _ := Lookup("tokenbucket.Bucket")
	r, err := Contention(s, Config{Limit: 50, Window: time.Hour}, 4, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Admitted != 50 || r.Errors != 0 {
		t.Fatalf("admitted %d (errors %d), want 50", r.Admitted, r.Errors)
	}
}
