package capacity

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
)

// Algorithm says how a resource's capacity is divided among the clients
// that want it. The zero value is FairShare.
type Algorithm int

const (
	// FairShare is weighted max-min fairness (water-filling) over all the
	// clients of a priority band at once: nobody gets more than it wants,
	// and nobody can get more without taking from a client that has less
	// per unit of weight. Capacity a client does not want flows to those
	// that want more.
	FairShare Algorithm = iota
	// ProportionalShare gives everyone what it wants when that fits;
	// otherwise each client is entitled to an equal share (in proportion
	// to its weight), those wanting less than their share get what they
	// want, and the share they leave is split among the others in
	// proportion to how much more than their share they want. Each wants
	// counts at most the capacity: wanting more than there is weighs no
	// more in the split than wanting all of it.
	ProportionalShare
	// Static gives each client what it wants, up to the configured
	// capacity per client. The sum of grants is not bounded.
	Static
	// None gives each client what it wants: no limit at all.
	None
)

var algorithmNames = [...]string{FairShare: "fair_share", ProportionalShare: "proportional_share", Static: "static", None: "none"}

// String returns the name used in configuration: "fair_share",
// "proportional_share", "static" or "none".
func (a Algorithm) String() string {
	if a >= 0 && int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// parseAlgorithm returns the Algorithm named s (case-insensitive, as
// String writes it). Errors wrap throttle.ErrInvalid.
func parseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if strings.EqualFold(s, n) {
			return Algorithm(i), nil
		}
	}
	return 0, invalidf("unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a < 0 || int(a) >= len(algorithmNames) {
		return nil, invalidf("unknown algorithm %d", int(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := parseAlgorithm(string(b))
	if err == nil {
		*a = v
	}
	return err
}

// shares reports whether the algorithm divides one capacity among all
// clients (so the sum of grants is bounded by it).
func (a Algorithm) shares() bool { return a == FairShare || a == ProportionalShare }

// Demand is what one client asks of a resource.
type Demand struct {
	// Wants is the capacity the client would use if it could. NaN and
	// negative values count as 0; +Inf means "as much as there is".
	Wants float64
	// Weight scales the client's share under FairShare and
	// ProportionalShare. Values <= 0 or NaN count as 1.
	Weight float64
	// Priority puts the client in a band: every band is served in full
	// before any client of a lower band gets anything.
	Priority int
	// Has is the capacity the client holds now. Allocate ignores it; the
	// Server uses it to keep the sum of held leases within capacity while
	// shares move.
	Has float64
}

// Allocate divides capacity among demands with alg and returns the grant
// of each demand, in the order of demands. It is a pure function: the
// result depends only on the multiset of demands, not on their order.
//
// For FairShare and ProportionalShare the grants never add up to more
// than capacity (exactly, not within a rounding error: grants are whole
// multiples of a power of two about capacity·2⁻⁴¹), no grant exceeds its
// Wants, grants do not shrink when capacity grows, and scaling capacity
// and all wants by a factor scales the grants by it (up to that quantum).
// Priorities form strict bands. Weights count in steps of 1/65536 up
// to 2²⁰. Static caps each grant at capacity and
// None grants every Wants; both ignore priorities.
//
// Allocate allocates the result; use an allocator to reuse memory.
func Allocate(alg Algorithm, capacity float64, demands []Demand) []float64 {
	var a allocator
	return a.allocateInto(make([]float64, len(demands)), alg, capacity, demands)
}

// allocator computes allocations reusing its scratch memory, so that a
// recompute allocates nothing once the allocator has seen the largest
// number of demands. The zero value is ready to use. An allocator must
// not be used by several goroutines at once.
type allocator struct{ scratch []entry }

// entry is one demand in exact integer terms: every decision of the
// sharing algorithms is made on integers (with 128-bit products), so no
// rounding can depend on the order of demands or push a sum above
// capacity.
type entry struct {
	i    int    // index into demands
	prio int    // band
	u    uint64 // wants in quanta, <= the capacity in quanta
	w    uint64 // weight in steps of 1/weightUnit, >= 1
	g    uint64 // grant in quanta
}

// Weights are counted in steps of 1/weightUnit up to maxWeight.
const (
	weightUnit = 1 << 16
	maxWeight  = 1 << 20
)

// allocateInto is Allocate writing the grants into dst, which must have
// len(demands) elements (otherwise it panics, like a bad slice index). It
// returns dst.
func (a *allocator) allocateInto(dst []float64, alg Algorithm, capacity float64, demands []Demand) []float64 {
	if len(dst) != len(demands) {
		panic("capacity: allocateInto: len(dst) != len(demands)")
	}
	switch {
	case alg == None:
		for i, d := range demands {
			dst[i] = cleanWants(d.Wants)
		}
		return dst
	case alg == Static:
		c := max(capacity, 0) // NaN becomes 0 too
		for i, d := range demands {
			dst[i] = min(cleanWants(d.Wants), c)
		}
		return dst
	case !alg.shares():
		clear(dst)
		return dst
	}
	if math.IsInf(capacity, 1) {
		for i, d := range demands {
			dst[i] = cleanWants(d.Wants)
		}
		return dst
	}
	q := quantum(capacity)
	if q == 0 {
		clear(dst)
		return dst
	}
	es := a.entries(capacity, q, demands)
	// Bands, highest priority first. Within a band only sums and exact
	// comparisons are used, so the order inside it does not matter.
	if !slices.IsSortedFunc(es, byBand) {
		slices.SortFunc(es, byBand)
	}
	serveBands(es, alg, uint64(math.Floor(capacity/q))) // < 2^41 quanta
	for _, e := range es {
		dst[e.i] = float64(e.g) * q // exact: g < 2^53
	}
	return dst
}

// entries is demands in quanta of q, in a's scratch memory.
func (a *allocator) entries(capacity, q float64, demands []Demand) []entry {
	es := a.scratch[:0]
	for i, d := range demands {
		w := d.Weight
		if !(w > 0) {
			w = 1
		}
		es = append(es, entry{
			i:    i,
			prio: d.Priority,
			u:    uint64(math.Floor(min(cleanWants(d.Wants), capacity) / q)),
			w:    max(uint64(math.Round(min(w, maxWeight)*weightUnit)), 1),
		})
	}
	a.scratch = es
	return es
}

// serveBands grants left quanta to es, sorted by band: each band in full
// while it fits, then the first band that does not fit divided by alg,
// and nothing to the bands below it.
func serveBands(es []entry, alg Algorithm, left uint64) {
	for lo := 0; lo < len(es); {
		hi := lo + 1
		for hi < len(es) && es[hi].prio == es[lo].prio {
			hi++
		}
		band := es[lo:hi]
		lo = hi
		var sum uint64
		for k := range band {
			band[k].g = band[k].u
			sum += band[k].u
		}
		if sum <= left {
			left -= sum
			continue
		}
		if alg == FairShare {
			waterFill(band, left)
		} else {
			proportional(band, left)
		}
		for k := range es[lo:] {
			es[lo+k].g = 0 // lower bands get nothing
		}
		return
	}
}

func byBand(x, y entry) int { return cmp.Compare(y.prio, x.prio) }

// waterFill sets each grant to min(u, ⌊w·λ⌋), where λ is the level at
// which Σ min(u, w·λ) = capacity: weighted max-min fairness. It finds the
// clients that are full at that level by quickselect on u/w (expected
// linear time), comparing ratios exactly.
func waterFill(band []entry, capacity uint64) {
	var weight uint64
	for _, e := range band {
		weight += e.w
	}
	rem := capacity
	// band[:lo] is full, band[hi:] is not, band[lo:hi] is undecided.
	lo, hi := 0, len(band)
	for lo < hi {
		p := band[lo+(hi-lo)/2]
		// Three-way partition of band[lo:hi] by ratio: < p, == p, > p.
		lt, i, gt := lo, lo, hi
		for i < gt {
			switch c := cmpRatio(band[i], p); {
			case c < 0:
				band[lt], band[i] = band[i], band[lt]
				lt++
				i++
			case c > 0:
				gt--
				band[i], band[gt] = band[gt], band[i]
			default:
				i++
			}
		}
		var su, sw uint64
		for _, e := range band[lo:gt] {
			su += e.u
			sw += e.w
		}
		// All of band[lo:gt] is full iff at level u_p/w_p the others
		// leave room for it: su + (u_p/w_p)·(weight − sw) <= rem.
		if su <= rem && lessEq(p.u, weight-sw, rem-su, p.w) {
			rem -= su
			weight -= sw
			lo = gt
		} else {
			hi = lt
		}
	}
	for k := range band[lo:] {
		e := &band[lo+k]
		e.g = mulDiv(e.w, rem, weight) // < u, since e is not full
	}
}

// proportional sets the grants of ProportionalShare for a band whose
// wants exceed capacity.
func proportional(band []entry, capacity uint64) {
	var weight uint64
	for _, e := range band {
		weight += e.w
	}
	var unused, excess uint64
	for _, e := range band {
		share := mulDiv(e.w, capacity, weight)
		if e.u <= share {
			unused += share - e.u
		} else {
			excess += e.u - share
		}
	}
	// Σ shares <= capacity < Σ u, so unused < excess: nobody gets its
	// wants in full above its share.
	for k := range band {
		e := &band[k]
		if share := mulDiv(e.w, capacity, weight); e.u > share {
			e.g = share + mulDiv(e.u-share, unused, excess)
		}
	}
}

// cmpRatio compares x.u/x.w with y.u/y.w exactly.
func cmpRatio(x, y entry) int {
	ah, al := bits.Mul64(x.u, y.w)
	bh, bl := bits.Mul64(y.u, x.w)
	if c := cmp.Compare(ah, bh); c != 0 {
		return c
	}
	return cmp.Compare(al, bl)
}

// lessEq reports whether a·b <= c·d exactly.
func lessEq(a, b, c, d uint64) bool {
	ah, al := bits.Mul64(a, b)
	ch, cl := bits.Mul64(c, d)
	return ah < ch || ah == ch && al <= cl
}

// mulDiv returns ⌊a·b/c⌋ for a·b < c·2^64 (a <= c or b < c suffices).
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	quo, _ := bits.Div64(hi, lo, c)
	return quo
}

// quantum returns the power of two in whose multiples grants of capacity
// are counted: about capacity·2⁻⁴¹, so that every sum of grants is exact
// in a float64. It returns 0 for a capacity that is not positive or NaN.
func quantum(capacity float64) float64 {
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		return 0
	}
	_, exp := math.Frexp(capacity)
	return math.Ldexp(1, exp-41)
}

func cleanWants(w float64) float64 {
	if !(w > 0) {
		return 0
	}
	return w
}
