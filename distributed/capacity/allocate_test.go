package capacity

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func wants(ws ...float64) []Demand {
	ds := make([]Demand, len(ws))
	for i, w := range ws {
		ds[i] = Demand{Wants: w}
	}
	return ds
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestAllocateTable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		alg      Algorithm
		capacity float64
		demands  []Demand
		want     []float64
	}{
		{"design example", FairShare, 120, wants(1000, 50, 10), []float64{60, 50, 10}},
		{"never above wants", FairShare, 100, wants(2, 40, 50), []float64{2, 40, 50}},
		{"equal split", FairShare, 90, wants(100, 100, 100), []float64{30, 30, 30}},
		{"all fit", FairShare, 100, wants(10, 20), []float64{10, 20}},
		{"weights", FairShare, 90, []Demand{{Wants: 100, Weight: 2}, {Wants: 100, Weight: 1}}, []float64{60, 30}},
		{"weights, small one full", FairShare, 90, []Demand{{Wants: 100, Weight: 1}, {Wants: 10, Weight: 5}}, []float64{80, 10}},
		{"bands", FairShare, 100, []Demand{{Wants: 80, Priority: 1}, {Wants: 80}, {Wants: 80}}, []float64{80, 10, 10}},
		{"high band overloaded starves low", FairShare, 100, []Demand{{Wants: 80, Priority: 1}, {Wants: 80, Priority: 1}, {Wants: 5}}, []float64{50, 50, 0}},
		{"bad wants", FairShare, 10, wants(math.NaN(), -5, 3), []float64{0, 0, 3}},
		{"infinite wants", FairShare, 10, wants(math.Inf(1), 2), []float64{8, 2}},
		{"zero capacity", FairShare, 0, wants(1, 2), []float64{0, 0}},
		{"NaN capacity", ProportionalShare, math.NaN(), wants(1, 2), []float64{0, 0}},
		{"proportional fits", ProportionalShare, 100, wants(10, 20), []float64{10, 20}},
		// Equal share 40; 10 leaves 30 unused, split 1:3 over excesses 20 and 60.
		{"proportional", ProportionalShare, 120, wants(10, 60, 100), []float64{10, 47.5, 62.5}},
		{"static", Static, 30, wants(10, 50), []float64{10, 30}},
		{"none", None, 30, wants(10, 50, math.NaN()), []float64{10, 50, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Allocate(tc.alg, tc.capacity, tc.demands)
			for i := range got {
				if !near(got[i], tc.want[i], 1e-9*max(tc.capacity, 1)) && !(math.IsNaN(tc.capacity) && got[i] == tc.want[i]) {
					t.Fatalf("Allocate(%v, %v, %v) = %v, want %v", tc.alg, tc.capacity, tc.demands, got, tc.want)
				}
			}
		})
	}
}

// refFairShare is plain iterative water-filling, band by band.
func refFairShare(capacity float64, ds []Demand) []float64 {
	out := make([]float64, len(ds))
	prios := []int{}
	for _, d := range ds {
		if !slices.Contains(prios, d.Priority) {
			prios = append(prios, d.Priority)
		}
	}
	slices.Sort(prios)
	slices.Reverse(prios)
	rem := capacity
	for _, p := range prios {
		active := map[int]bool{}
		for i, d := range ds {
			if d.Priority == p {
				active[i] = true
			}
		}
		for len(active) > 0 {
			var w float64
			for i := range active {
				w += ds[i].Weight
			}
			level := rem / w
			done := false
			for i := range active {
				if ds[i].Wants <= ds[i].Weight*level {
					out[i] = ds[i].Wants
					rem -= ds[i].Wants
					delete(active, i)
					done = true
				}
			}
			if !done {
				for i := range active {
					out[i] = ds[i].Weight * level
				}
				rem = 0
				active = nil
			}
		}
	}
	return out
}

func randDemands(r *rand.Rand, n int, capacity float64) []Demand {
	ds := make([]Demand, n)
	for i := range ds {
		ds[i] = Demand{Wants: r.Float64() * capacity * 2 / float64(n) * 3, Weight: float64(32+r.IntN(200)) / 64, Priority: r.IntN(3)}
		if r.IntN(5) == 0 {
			ds[i].Wants = float64(r.IntN(10))
		}
	}
	return ds
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// checkInvariants checks what must hold for every input of a sharing
// algorithm; it returns a description of the first violation.
func checkInvariants(t *testing.T, alg Algorithm, capacity float64, ds []Demand) {
	t.Helper()
	got := Allocate(alg, capacity, ds)
	// Exact: the sum of grants, in any order of summation, is <= capacity.
	var s float64
	for i, g := range got {
		if g < 0 || math.IsNaN(g) || g > cleanWants(ds[i].Wants) {
			t.Fatalf("%v: grant %d = %v, wants %v", alg, i, g, ds[i].Wants)
		}
		s += g
	}
	if s > capacity && capacity >= 0 {
		t.Fatalf("%v: sum %v > capacity %v (by %g)", alg, s, capacity, s-capacity)
	}
	if r := sum(slices.Clone(got)); r > capacity && capacity >= 0 {
		t.Fatalf("%v: sum %v > capacity %v", alg, r, capacity)
	}
	// Order independence, exactly.
	perm := rand.New(rand.NewPCG(uint64(len(ds)), 7)).Perm(len(ds))
	pd := make([]Demand, len(ds))
	for i, p := range perm {
		pd[i] = ds[p]
	}
	pg := Allocate(alg, capacity, pd)
	for i, p := range perm {
		if pg[i] != got[p] {
			t.Fatalf("%v: order changes grant of demand %d: %v vs %v", alg, p, pg[i], got[p])
		}
	}
	tol := 1e-9 * max(capacity, 1)
	// Monotone in capacity.
	more := Allocate(alg, capacity*1.25+1, ds)
	for i := range got {
		if more[i] < got[i]-tol {
			t.Fatalf("%v: more capacity lowers grant %d: %v -> %v", alg, i, got[i], more[i])
		}
	}
	// Scaling.
	for _, k := range []float64{4, 3.7} {
		sd := slices.Clone(ds)
		for i := range sd {
			sd[i].Wants *= k
		}
		sg := Allocate(alg, capacity*k, sd)
		for i := range got {
			if !near(sg[i], got[i]*k, tol*k) || (k == 4 && sg[i] != got[i]*k) {
				t.Fatalf("%v: scaling by %v: grant %d %v vs %v", alg, k, i, sg[i], got[i]*k)
			}
		}
	}
}

func TestAllocateProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 400 {
		n := 1 + r.IntN(40)
		capacity := []float64{1, 100, 0.3, 1e6, 7777.77}[r.IntN(5)]
		ds := randDemands(r, n, capacity)
		for _, alg := range []Algorithm{FairShare, ProportionalShare} {
			checkInvariants(t, alg, capacity, ds)
		}
		ref := refFairShare(capacity, ds)
		got := Allocate(FairShare, capacity, ds)
		for i := range got {
			if !near(got[i], ref[i], 1e-9*capacity) {
				t.Fatalf("FairShare(%v, %v)[%d] = %v, reference %v", capacity, ds, i, got[i], ref[i])
			}
		}
	}
}

// TestAllocateFull checks that sharing algorithms leave nothing unused
// (beyond the rounding quantum) while someone wants more.
func TestAllocateFull(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		capacity := 1 + r.Float64()*1000
		ds := randDemands(r, 1+r.IntN(30), capacity)
		var total float64
		for _, d := range ds {
			total += d.Wants
		}
		for _, alg := range []Algorithm{FairShare, ProportionalShare} {
			got := sum(Allocate(alg, capacity, ds))
			if want := min(total, capacity); got < want-1e-9*capacity {
				t.Fatalf("%v: granted %v of min(capacity %v, wants %v)", alg, got, capacity, total)
			}
		}
	}
}

func FuzzAllocate(f *testing.F) {
	f.Add(120.0, 1000.0, 50.0, 10.0, 1.0, 2.0, 0, 1)
	f.Add(100.0, 2.0, 40.0, 50.0, 0.0, -1.0, 3, 3)
	f.Add(1e300, 1e308, math.Inf(1), 1e-300, 1e-10, 1e10, -5, 5)
	f.Fuzz(func(t *testing.T, capacity, a, b, c, wa, wb float64, pa, pb int) {
		ds := []Demand{{Wants: a, Weight: wa, Priority: pa}, {Wants: b, Weight: wb, Priority: pb}, {Wants: c}, {Wants: a, Weight: wb}, {Wants: b / 3}}
		if math.IsNaN(capacity) || math.IsInf(capacity, 0) || capacity < 0 {
			for _, alg := range []Algorithm{FairShare, ProportionalShare, Static, None} {
				Allocate(alg, capacity, ds) // must not panic
			}
			return
		}
		for _, alg := range []Algorithm{FairShare, ProportionalShare} {
			got := Allocate(alg, capacity, ds)
			var s float64
			for i, g := range got {
				if !(g >= 0) || g > cleanWants(ds[i].Wants) {
					t.Fatalf("%v: grant %d = %v, wants %v", alg, i, g, ds[i].Wants)
				}
				s += g
			}
			if s > capacity {
				t.Fatalf("%v: sum %v > capacity %v", alg, s, capacity)
			}
		}
	})
}

func TestAlgorithmNames(t *testing.T) {
	for _, a := range []Algorithm{FairShare, ProportionalShare, Static, None} {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var c Algorithm
		if err := c.UnmarshalText(b); err != nil || c != a {
			t.Fatalf("%v round trip: %v %v", a, c, err)
		}
	}
	if _, err := parseAlgorithm("fast"); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
}

func makeDemands(n int) []Demand {
	r := rand.New(rand.NewPCG(5, 6))
	ds := make([]Demand, n)
	for i := range ds {
		ds[i] = Demand{Wants: r.Float64() * 20, Weight: 1 + float64(r.IntN(3)), Priority: r.IntN(2)}
	}
	return ds
}

func BenchmarkAllocate10k(b *testing.B) {
	ds := makeDemands(10_000)
	dst := make([]float64, len(ds))
	for _, alg := range []Algorithm{FairShare, ProportionalShare} {
		b.Run(alg.String(), func(b *testing.B) {
			var a allocator
			b.ReportAllocs()
			for b.Loop() {
				a.allocateInto(dst, alg, 50_000, ds)
			}
		})
	}
	one := makeDemands(10_000)
	for i := range one {
		one[i].Priority = 0
	}
	b.Run("fair_share/one_band", func(b *testing.B) {
		var a allocator
		b.ReportAllocs()
		for b.Loop() {
			a.allocateInto(dst, FairShare, 50_000, one)
		}
	})
}

// TestProportionalShareCapsWants: wanting more than the capacity weighs
// like wanting all of it, as ProportionalShare's doc says.
func TestProportionalShareCapsWants(t *testing.T) {
	huge := Allocate(ProportionalShare, 100, []Demand{{Wants: 1e6}, {Wants: 100}, {Wants: 20}})
	all := Allocate(ProportionalShare, 100, []Demand{{Wants: 100}, {Wants: 100}, {Wants: 20}})
	if !slices.Equal(huge, all) {
		t.Fatalf("wants 1e6 got %v, wants 100 got %v", huge, all)
	}
}
