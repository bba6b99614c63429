package benchmarks

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/benchutil"
)

// Workload is one speed benchmark, run identically on every subject that
// supports it.
type Workload struct {
	Name     string // column title
	Slug     string // benchmark name
	Keys     int    // distinct keys cycled through; 1 is a single key
	Parallel bool   // b.RunParallel instead of a serial loop
	Denied   bool   // every call is denied (otherwise every call is allowed)
}

// The workloads. A single-resource subject runs the one-key workloads; a
// keyed subject runs them on one fixed key, and the many-key ones too.
var (
	Allow             = Workload{Name: "allow", Slug: "allow", Keys: 1}
	AllowPar          = Workload{Name: "allow ∥", Slug: "allow-par", Keys: 1, Parallel: true}
	Deny              = Workload{Name: "deny", Slug: "deny", Keys: 1, Denied: true}
	DenyPar           = Workload{Name: "deny ∥", Slug: "deny-par", Keys: 1, Parallel: true, Denied: true}
	Keys100k          = Workload{Name: "100k keys", Slug: "keys100k", Keys: 100_000}
	Keys100kPar       = Workload{Name: "100k keys ∥", Slug: "keys100k-par", Keys: 100_000, Parallel: true}
	Keys1M            = Workload{Name: "1M keys", Slug: "keys1M", Keys: 1_000_000}
	Keys1MPar         = Workload{Name: "1M keys ∥", Slug: "keys1M-par", Keys: 1_000_000, Parallel: true}
	QuickWorkloads    = []Workload{Allow, AllowPar, Deny, DenyPar, Keys100k, Keys100kPar}
	ThoroughWorkloads = []Workload{Allow, AllowPar, Deny, DenyPar, Keys100k, Keys100kPar, Keys1M, Keys1MPar}
)

// The limits of the speed workloads.
//
// Allowed, one key: a million per 10 ms, far above what two cores can
// ask for, so every call is admitted while the limiter still does its
// full bookkeeping (refills, window turns, log expiry).
//
// Allowed, many keys: a million per 3·10^7 seconds (347 days) per key (one per 30 s,
// burst a million). A key is visited once per pass over all keys, a few
// seconds at most for a million keys, so it never fills back up between
// visits: every key stays live, and the workload measures finding and updating the state of an
// existing key. (With a faster refill, a key would be full again before
// its next visit, and limiters that drop full keys to bound memory, as
// ours do, would measure re-creating it instead.)
//
// Denied: one per hour, spent before timing starts.
var (
	allowConfig = Config{Limit: 1_000_000, Window: 10 * time.Millisecond}
	keysConfig  = Config{Limit: 1_000_000, Window: 30_000_000 * time.Second}
	denyConfig  = Config{Limit: 1, Window: time.Hour}
)

// warmCalls are made, untimed, before each measurement.
const warmCalls = 10_000

// Supports reports whether s runs w.
func (w Workload) Supports(s Subject) bool {
	switch {
	case w.Denied && s.Blocks:
		return false
	case w.Keys > 1 && !s.Keyed:
		return false
	}
	return true
}

var (
	keysMu     sync.Mutex
	keysCache  = map[int][]string{}
	visitCache = map[int][]string{}
)

// visitOrder returns Keys(n) in the order timed calls visit them (see
// benchutil.Visit), the same slice for every subject.
func visitOrder(n int) []string {
	keys := Keys(n)
	keysMu.Lock()
	defer keysMu.Unlock()
	if v, ok := visitCache[n]; ok {
		return v
	}
	v := benchutil.Visit(keys)
	visitCache[n] = v
	return v
}

// Keys returns n distinct keys, the same slice for every subject.
func Keys(n int) []string {
	keysMu.Lock()
	defer keysMu.Unlock()
	if k, ok := keysCache[n]; ok {
		return k
	}
	k := make([]string, n)
	for i := range k {
		k[i] = "tenant-" + strconv.Itoa(i)
	}
	if n == 1 {
		k[0] = "tenant-single"
	}
	keysCache[n] = k
	return k
}

// Instance is a subject built and warmed up for the workloads that share
// its key count and path (allowed or denied).
type Instance struct {
	Subject Subject
	l       throttle.Limiter
	keys    []string // in the order they are first seen
	visit   []string // in the order timed calls visit them
	denied  bool
}

// Prepare builds s for workloads of keys keys on the allowed or denied
// path, and warms it up: every key is seen once, then untimed calls are
// made (see below). Close the instance when done.
func Prepare(s Subject, keys int, denied bool) (*Instance, error) {
	c := allowConfig
	switch {
	case denied:
		c = denyConfig
	case keys > 1:
		c = keysConfig
	case s.SpeedConfig != nil:
		c = s.SpeedConfig(c)
	}
	l, err := s.Open(c)
	if err != nil {
		return nil, err
	}
	in := &Instance{Subject: s, l: l, keys: Keys(keys), visit: visitOrder(keys), denied: denied}
	for _, k := range in.keys {
		if _, err := l.Allow(bg, k, 1); err != nil {
			closeLimiter(l)
			return nil, fmt.Errorf("%s: warm-up: %w", s.Name, err)
		}
	}
	// At least warmCalls calls, and on one key at least two windows of
	// calls, so that per-key state (a sliding log's ring) is at its
	// working size before timing starts.
	warmUntil := time.Now()
	if keys == 1 && c.Window <= time.Second {
		warmUntil = warmUntil.Add(2 * c.Window)
	}
	for i := 0; i < warmCalls || time.Now().Before(warmUntil); i++ {
		_, _ = l.Allow(bg, in.keys[i%len(in.keys)], 1)
	}
	return in, nil
}

// Close releases the limiter.
func (in *Instance) Close() { closeLimiter(in.l) }

// Body returns the benchmark of w on in. It reports "miss/op": the share
// of calls that did not take the intended path (a denial in an allowed
// workload, an admission in a denied one, or an error).
func (in *Instance) Body(w Workload) func(*testing.B) {
	l, keys, want := in.l, in.visit, !in.denied
	if !w.Parallel {
		return func(b *testing.B) {
			b.ReportAllocs()
			miss, i := 0, 0
			for b.Loop() {
				if missed(l, keys[i], want) {
					miss++
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
			b.ReportMetric(float64(miss)/float64(b.N), "miss/op")
		}
	}
	return func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer() // exclude the caller's setup, as b.Loop does
		var misses, worker atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine starts at its own place in the key cycle.
			i := int(worker.Add(1)*7919) % len(keys)
			miss := int64(0)
			for pb.Next() {
				if missed(l, keys[i], want) {
					miss++
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
			misses.Add(miss)
		})
		b.ReportMetric(float64(misses.Load())/float64(b.N), "miss/op")
	}
}

// missed calls l for one unit of key and reports whether the decision
// missed the intended path: allowed if want, else denied, and no error.
// Small enough to be inlined into the benchmark loops.
func missed(l throttle.Limiter, key string, want bool) bool {
	d, err := l.Allow(bg, key, 1)
	return d.Allowed != want || err != nil
}

// Sample is one measurement of one case.
type Sample struct {
	N           int
	NsPerOp     float64
	BytesPerOp  float64
	AllocsPerOp float64
	MissPerOp   float64
}

// SpeedResult holds the samples of one subject on one workload.
type SpeedResult struct {
	Subject  Subject
	Workload Workload
	Samples  []Sample // one per round, in round order
}

// Median returns the median of each measure over the samples.
func (r SpeedResult) Median() Sample {
	pick := func(f func(Sample) float64) float64 {
		v := make([]float64, len(r.Samples))
		for i, s := range r.Samples {
			v[i] = f(s)
		}
		return median(v)
	}
	return Sample{
		NsPerOp:     pick(func(s Sample) float64 { return s.NsPerOp }),
		BytesPerOp:  pick(func(s Sample) float64 { return s.BytesPerOp }),
		AllocsPerOp: pick(func(s Sample) float64 { return s.AllocsPerOp }),
		MissPerOp:   pick(func(s Sample) float64 { return s.MissPerOp }),
	}
}

// Spread returns the smallest and largest ns/op of the samples.
func (r SpeedResult) Spread() (lo, hi float64) {
	for i, s := range r.Samples {
		if i == 0 || s.NsPerOp < lo {
			lo = s.NsPerOp
		}
		if i == 0 || s.NsPerOp > hi {
			hi = s.NsPerOp
		}
	}
	return lo, hi
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// SpeedOptions configures RunSpeed.
type SpeedOptions struct {
	Subjects  []Subject
	Workloads []Workload
	Count     int           // rounds; every case is measured once per round
	BenchTime time.Duration // target duration of one measurement on one key
	// KeyedCount is the number of rounds of the many-key workloads
	// (default Count). One sample of those makes exactly as many calls as
	// there are keys, so it visits every key once.
	KeyedCount int
	Progress   io.Writer // optional
}

// RunSpeed measures every supported (workload, subject) pair Count times.
//
// The rounds are interleaved: round i measures every case once before
// round i+1 starts, so drift of a noisy machine spreads over all subjects
// alike and ratios taken within a round (Guard) compare like with like.
// Workloads that share a key count and a path (allowed or denied) share
// one warmed-up instance per subject. On a single key each subject keeps
// its instance for all rounds. With many keys only one large key map is
// alive at a time (the testing package collects garbage before every
// measurement, and a dozen live maps of a million keys would make that
// the cost being measured), so each round prepares every subject's
// instance afresh and closes it after its measurements: every round also
// measures the same state, where a kept instance would carry more history
// into each round (a sliding log, one more entry per key).
func RunSpeed(o SpeedOptions) ([]SpeedResult, error) {
	testing.Init()
	benchtime := flag.Lookup("test.benchtime")
	if benchtime == nil {
		return nil, fmt.Errorf("testing: no test.benchtime flag")
	}
	m := &measurer{benchTime: o.BenchTime, flag: benchtime.Value}
	count := max(o.Count, 1)
	keyedCount := count
	if o.KeyedCount > 0 {
		keyedCount = o.KeyedCount
	}
	groups, res := speedCases(o)
	for _, g := range groups {
		start := time.Now()
		var idx []int // results of this group
		for i, r := range res {
			if r.Workload.Keys == g.keys && r.Workload.Denied == g.denied {
				idx = append(idx, i)
			}
		}
		var err error
		if g.keys == 1 {
			err = m.oneKey(res, idx, g, count)
		} else {
			err = m.manyKeys(res, idx, g, keyedCount, o.Subjects)
		}
		if err != nil {
			return nil, err
		}
		if o.Progress != nil {
			path := "allowed"
			if g.denied {
				path = "denied"
			}
			fmt.Fprintf(o.Progress, "speed: %d key(s), %s path: done in %v\n", g.keys, path, time.Since(start).Round(time.Millisecond))
		}
	}
	return res, m.failed
}

// speedGroup is the workloads that share a key count and a path, and so
// an instance of a subject.
type speedGroup struct {
	keys   int
	denied bool
}

// speedCases are the groups of o's workloads, and a result to fill for
// every supported (workload, subject) pair.
func speedCases(o SpeedOptions) (groups []speedGroup, res []SpeedResult) {
	for _, w := range o.Workloads {
		if g := (speedGroup{w.Keys, w.Denied}); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		for _, s := range o.Subjects {
			if w.Supports(s) {
				res = append(res, SpeedResult{Subject: s, Workload: w})
			}
		}
	}
	return groups, res
}

// measurer takes the samples of RunSpeed through the testing package,
// whose benchtime flag it sets for each.
type measurer struct {
	benchTime time.Duration // SpeedOptions.BenchTime
	flag      flag.Value    // test.benchtime
	failed    error         // the first failure to set it
}

// measure adds a sample of r's workload on in to r.
func (m *measurer) measure(r *SpeedResult, in *Instance) {
	bt := m.benchTime.String()
	if r.Workload.Keys > 1 {
		bt = strconv.Itoa(r.Workload.Keys) + "x"
	}
	if m.benchTime > 0 || r.Workload.Keys > 1 {
		if err := m.flag.Set(bt); err != nil && m.failed == nil {
			m.failed = err
		}
	}
	br := testing.Benchmark(in.Body(r.Workload))
	r.Samples = append(r.Samples, Sample{
		N:           br.N,
		NsPerOp:     float64(br.T.Nanoseconds()) / float64(max(br.N, 1)),
		BytesPerOp:  float64(br.AllocedBytesPerOp()),
		AllocsPerOp: float64(br.AllocsPerOp()),
		MissPerOp:   br.Extra["miss/op"],
	})
}

// oneKey measures the results idx of res, of group g on a single key,
// count rounds, each subject on one instance kept for all rounds.
func (m *measurer) oneKey(res []SpeedResult, idx []int, g speedGroup, count int) error {
	inst := map[string]*Instance{}
	defer func() {
		for _, in := range inst {
			in.Close()
		}
	}()
	for _, i := range idx {
		s := res[i].Subject
		if inst[s.Name] != nil {
			continue
		}
		in, err := Prepare(s, g.keys, g.denied)
		if err != nil {
			return err
		}
		inst[s.Name] = in
	}
	for range count {
		for _, i := range idx {
			m.measure(&res[i], inst[res[i].Subject.Name])
		}
	}
	return nil
}

// manyKeys measures the results idx of res, of group g on many keys,
// count rounds, each round on an instance of each of subjects prepared
// afresh and closed after its measurements.
func (m *measurer) manyKeys(res []SpeedResult, idx []int, g speedGroup, count int, subjects []Subject) error {
	for range count {
		for _, s := range subjects {
			var mine []int
			for _, i := range idx {
				if res[i].Subject.Name == s.Name {
					mine = append(mine, i)
				}
			}
			if len(mine) == 0 {
				continue
			}
			in, err := Prepare(s, g.keys, g.denied)
			if err != nil {
				return err
			}
			for _, i := range mine {
				m.measure(&res[i], in)
			}
			in.Close()
			runtime.GC()
		}
	}
	return nil
}

// Slug turns a subject name into a benchmark name element.
func Slug(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return b.String()
}

// WriteBenchFormat writes every sample in the Go benchmark format, one
// line per sample, so that benchstat can read the file.
func WriteBenchFormat(w io.Writer, res []SpeedResult, procs int) error {
	for _, r := range res {
		for _, s := range r.Samples {
			_, err := fmt.Fprintf(w, "BenchmarkSpeed/%s/%s-%d\t%d\t%.2f ns/op\t%.0f B/op\t%.0f allocs/op\t%.4g miss/op\n",
				r.Workload.Slug, Slug(r.Subject.Name), procs, s.N, s.NsPerOp, s.BytesPerOp, s.AllocsPerOp, s.MissPerOp)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// GuardResult compares one of our subjects with x/time/rate on one
// workload of the same run.
type GuardResult struct {
	Subject  string
	Workload string
	Ratio    float64 // median over rounds of ours/x/time/rate ns/op
	MinRatio float64 // fastest sample of ours / fastest of x/time/rate
	Ours     float64 // median ns/op
	Peer     float64 // median ns/op of x/time/rate
	Slower   int     // rounds in which ours was slower
	Rounds   int
	P        float64 // one-sided sign test: the chance of Slower or more of Rounds if both were as fast
	Fail     bool
}

// Guard checks that every one of our subjects is no slower than
// x/time/rate on the serial single-key workloads (allow and deny). Two
// ratios of ns/op are computed: the median over rounds of the ratio
// within a round, and the ratio of the fastest samples (interference
// from other processes only ever slows a sample down, so the fastest
// ones are the least disturbed). A subject fails when both exceed
// maxRatio and a one-sided sign test over the paired rounds says ours
// was slower in more rounds than chance allows (p < 0.05): a real
// regression moves all three, a noisy round or two moves none of them
// far enough.
func Guard(res []SpeedResult, maxRatio float64) []GuardResult {
	const peer = "x/time/rate"
	var out []GuardResult
	for _, w := range []Workload{Allow, Deny} {
		var base *SpeedResult
		for i := range res {
			if res[i].Workload.Slug == w.Slug && res[i].Subject.Name == peer {
				base = &res[i]
			}
		}
		if base == nil {
			continue
		}
		for _, r := range res {
			if !r.Subject.Ours || r.Workload.Slug != w.Slug {
				continue
			}
			var ratios []float64
			slower := 0
			for i := range min(len(r.Samples), len(base.Samples)) {
				ratios = append(ratios, r.Samples[i].NsPerOp/base.Samples[i].NsPerOp)
				if ratios[i] > maxRatio {
					slower++
				}
			}
			lo, _ := r.Spread()
			blo, _ := base.Spread()
			g := GuardResult{
				Subject: r.Subject.Name, Workload: w.Name,
				Ratio: median(ratios), MinRatio: lo / blo, Ours: r.Median().NsPerOp, Peer: base.Median().NsPerOp,
				Slower: slower, Rounds: len(ratios), P: signTest(slower, len(ratios)),
			}
			g.Fail = g.Ratio > maxRatio && g.MinRatio > maxRatio && g.P < 0.05
			out = append(out, g)
		}
	}
	return out
}

// signTest returns the chance of k or more successes in n fair coin
// tosses.
func signTest(k, n int) float64 {
	p, c := 0.0, 1.0 // c: n choose i
	for i := 0; i <= n; i++ {
		if i >= k {
			p += c
		}
		c = c * float64(n-i) / float64(i+1)
	}
	return p / math.Pow(2, float64(n))
}

// emptySubject admits everything and does nothing else: through the
// speed loop it measures the loop itself.
var emptySubject = Subject{Name: "(the loop alone)", Keyed: true, New: func(Config) (throttle.Limiter, error) {
	return throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{Allowed: true}, nil
	}), nil
}}

// Overhead measures what the speed loop itself costs per call on w's
// keys (serial or parallel as w): cycling through the keys, the call
// through the throttle.Limiter interface and the check of the decision,
// with a limiter that does nothing. It is the median of count samples,
// in ns/op, and part of every ns/op of w; ratios that subtract it compare
// what a user's call costs.
func Overhead(w Workload, count int, benchtime time.Duration) (float64, error) {
	w.Denied = false
	res, err := RunSpeed(SpeedOptions{Subjects: []Subject{emptySubject}, Workloads: []Workload{w}, Count: count, KeyedCount: count, BenchTime: benchtime})
	if err != nil || len(res) == 0 {
		return 0, err
	}
	return res[0].Median().NsPerOp, nil
}

// BytesPerKey measures the heap a keyed subject holds per tracked key:
// the live heap after keys distinct keys each made one admitted request,
// less the live heap before, over keys (the key strings themselves are
// built beforehand and not counted).
func BytesPerKey(s Subject, keys int) (float64, error) {
	ks := Keys(keys)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l, err := s.Open(keysConfig)
	if err != nil {
		return 0, err
	}
	for _, k := range ks {
		if _, err := l.Allow(bg, k, 1); err != nil {
			closeLimiter(l)
			return 0, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(l)
	closeLimiter(l)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(keys), nil
}
