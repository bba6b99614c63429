package window

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestLayout(t *testing.T) {
	if _, ok := NewLayout(1<<24-1, 2); !ok {
		t.Fatal("two 24-bit counts rejected")
	}
	if _, ok := NewLayout(1<<24, 2); ok {
		t.Fatal("two 25-bit counts accepted: fewer than MinTagBits left")
	}
	if _, ok := NewLayout(0, 1); ok {
		t.Fatal("limit 0 accepted")
	}
	l, _ := NewLayout(100, 2) // 7-bit counts, 49-bit tag
	if l.TagBits() != 49 {
		t.Fatalf("TagBits = %d, want 49", l.TagBits())
	}
	for _, idx := range []int64{0, 1, 1 << 48, 1<<49 - 1, 1 << 49, 1 << 62, math.MaxInt64, -1, -12345} {
		w := l.Pack2(idx, 100, 3)
		if w < 0 || l.Hi(w) != 100 || l.Lo(w) != 3 {
			t.Fatalf("Pack2(%d): %x", idx, w)
		}
		for _, d := range []int64{0, 1, 2, -1, -2, 1<<48 - 1, -(1 << 48)} {
			if got := l.Since(w, idx+d); got != d {
				t.Fatalf("Since(Pack2(%d), +%d) = %d", idx, d, got)
			}
		}
		if got := l.Since(w, idx+1<<49); got != 0 {
			t.Fatalf("Since a whole tag period later = %d, want 0 (wrapped)", got)
		}
	}
	if got := l.Skew(1); got != 1e9 {
		t.Fatalf("Skew(1ns) = %d, want 1e9", got)
	}
	if w, _ := NewLayout(1<<24-1, 2); w.Skew(1) != 1<<12 {
		t.Fatalf("Skew(1ns) with a 15-bit tag = %d, want capped at 2^12", w.Skew(1))
	}
	if got := l.Skew(1e9); got != 2 {
		t.Fatalf("Skew(1s) = %d, want 2", got)
	}
	if got := l.Skew(1e6); got != 1000 {
		t.Fatalf("Skew(1ms) = %d, want 1000", got)
	}
}

func TestDivisor(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	divisors := []int64{1, 2, 3, 7, 1000, 1e9, 1e9 + 7, math.MaxInt64, 1 << 62, 86400e9}
	for range 200 {
		divisors = append(divisors, 1+rng.Int64N(math.MaxInt64), 1+rng.Int64N(1<<40))
	}
	for _, d := range divisors {
		v := NewDivisor(d)
		for _, a := range []int64{0, 1, d - 1, d, d + 1, math.MaxInt64, math.MaxInt64 - 1, rng.Int64(), -1, -d, -d - 1, math.MinInt64 + 1} {
			q, r := v.FloorDiv(a)
			if q != FloorDiv(a, d) || r != FloorMod(a, d) {
				t.Fatalf("FloorDiv(%d, %d) = %d, %d", a, d, q, r)
			}
		}
		for range 100 {
			a := rng.Uint64()
			q, r := v.DivU(a)
			if q != a/uint64(d) || r != a%uint64(d) {
				t.Fatalf("DivU(%d, %d) = %d, %d", a, d, q, r)
			}
			x, y := rng.Int64N(1<<24), rng.Int64N(d)
			want := new(big.Int).Mul(big.NewInt(x), big.NewInt(y))
			want.Add(want, big.NewInt(d-1)).Quo(want, big.NewInt(d))
			if got := v.CeilMulDiv(x, y); got != want.Int64() {
				t.Fatalf("CeilMulDiv(%d, %d, %d) = %d, want %v", x, y, d, got, want)
			}
		}
	}
}

func FuzzDivisor(f *testing.F) {
	f.Add(int64(7), uint64(100))
	f.Fuzz(func(t *testing.T, d int64, a uint64) {
		if d <= 0 {
			return
		}
		q, r := NewDivisor(d).DivU(a)
		if q != a/uint64(d) || r != a%uint64(d) {
			t.Fatalf("DivU(%d, %d) = %d, %d", a, d, q, r)
		}
	})
}

func TestMulDiv(t *testing.T) {
	if q, exact := MulDiv(1<<40, 1<<40, 1<<30); q != 1<<50 || !exact {
		t.Fatalf("MulDiv = %d, %v", q, exact)
	}
	if q := CeilMulDiv(10, 3, 4); q != 8 {
		t.Fatalf("CeilMulDiv(10,3,4) = %d", q)
	}
}
