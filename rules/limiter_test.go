package rules_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
)

var ctx = context.Background()

// newLimiter returns a limiter of the rules in doc on a virtual clock,
// closed at the end of the test.
func newLimiter(t testing.TB, doc string, opts ...rules.Option) (*rules.Limiter, *throttletest.Clock) {
	t.Helper()
	c, err := rules.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	clk := throttletest.NewClock()
	l, err := rules.New(c, append([]rules.Option{rules.WithLimiterOptions(throttle.WithClock(clk))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clk
}

// admitted counts how many single units key gets at one instant.
func admitted(t *testing.T, l throttle.Limiter, key string) int {
	t.Helper()
	for i := 0; i < 100000; i++ {
		d, err := l.Allow(ctx, key, 1)
		if err != nil {
			t.Fatalf("Allow(%q): %v", key, err)
		}
		if !d.Allowed {
			return i
		}
	}
	return -1 // unlimited
}

func TestRouting(t *testing.T) {
	l, _ := newLimiter(t, sample, rules.WithTierMap(map[string]string{"bob": "free", "carol": "pro"}))
	for key, want := range map[string]int{
		"someone":             20,    // default
		"acme":                10000, // rule → tier pro
		"bob":                 5,     // tier map
		"carol":               10000,
		"internal:x":          1000, // prefix
		"internal:batch:x":    1,    // longer prefix wins
		"batch-a-nightly":     5,    // pattern
		"healthcheck":         -1,   // allow list
		"ops:deploy":          -1,
		"internal:":           1000,
		"batch--nightly":      5,
		"batch-nightly":       20, // pattern needs the dashes
		"scraper-1":           20, // pattern needs "-" after one char
		"internal:batchy":     1000,
		"internal:batch:more": 1,
	} {
		if got := admitted(t, l, key); got != want {
			t.Errorf("%q admitted %d, want %d", key, got, want)
		}
	}
	for _, key := range []string{"abuser", "scraper-1-x", "scraper-é-"} {
		d, err := l.Allow(ctx, key, 1)
		if !errors.Is(err, throttle.ErrDenied) || d.Allowed {
			t.Errorf("%q: %+v, %v; want throttle.ErrDenied", key, d, err)
		}
	}
}

func TestLookup(t *testing.T) {
	l, _ := newLimiter(t, sample, rules.WithTierFunc(func(k string) string {
		if k == "bob" {
			return "free"
		}
		return ""
	}))
	for key, want := range map[string]rules.Match{
		"abuser":          {Kind: "deny"},
		"ops:x":           {Kind: "allow"},
		"acme":            {Kind: "key", Pattern: "acme", Tier: "pro", Limit: rules.Limit{Count: 10000, Window: time.Hour}},
		"internal:q":      {Kind: "prefix", Pattern: "internal:", Limit: rules.Limit{Rate: throttle.PerSecond(1000), Burst: 1000}},
		"batch-x-nightly": {Kind: "pattern", Pattern: "batch-*-nightly", Limit: rules.Limit{Count: 5, Window: time.Minute}},
		"bob":             {Kind: "tier", Tier: "free", Limit: rules.Limit{Rate: throttle.PerSecond(1), Burst: 5}},
		"zed":             {Kind: "default", Limit: rules.Limit{Rate: throttle.PerSecond(10), Burst: 20}},
	} {
		got, err := l.Lookup(key)
		if err != nil || got != want {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v", key, got, err, want)
		}
	}
}

func TestSpecificity(t *testing.T) {
	doc := `{"default": {"rate": "1/s", "burst": 1}, "rules": [
	  {"pattern": "a*", "rate": "1/s", "burst": 2},
	  {"prefix": "ab", "rate": "1/s", "burst": 3},
	  {"pattern": "ab*", "rate": "1/s", "burst": 4},
	  {"pattern": "a?c*", "rate": "1/s", "burst": 5},
	  {"pattern": "*abcd", "rate": "1/s", "burst": 6},
	  {"key": "abcd", "rate": "1/s", "burst": 7}
	]}`
	l, _ := newLimiter(t, doc)
	for key, want := range map[string]int{
		"ax":    2, // only a*
		"abx":   3, // prefix ab beats pattern ab* (same literal count)
		"abc":   3, // a?c* has 2 literals, fewer than ab
		"aXc":   5,
		"xabcd": 6,
		"abcd":  7, // exact wins
		"abcde": 3,
		"b":     1,
	} {
		if got := admitted(t, l, key); got != want {
			t.Errorf("%q admitted %d, want %d", key, got, want)
		}
	}
}

func TestBadInput(t *testing.T) {
	l, _ := newLimiter(t, sample, rules.WithTierFunc(func(string) string { return "gold" }))
	for name, call := range map[string]func() error{
		"empty key":    func() error { _, err := l.Allow(ctx, "", 1); return err },
		"long key":     func() error { _, err := l.Allow(ctx, string(make([]byte, 2000)), 1); return err },
		"zero n":       func() error { _, err := l.Allow(ctx, "someone", 0); return err },
		"allowed n":    func() error { _, err := l.Allow(ctx, "healthcheck", -1); return err },
		"unknown tier": func() error { _, err := l.Allow(ctx, "someone-unmatched", 1); return err },
		"reserve n":    func() error { _, err := l.Reserve(ctx, "ops:x", 0, 0); return err },
	} {
		if err := call(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := l.Allow(ctx, "internal:x", 1001); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("n above burst: %v", err)
	}
	var zero rules.Limiter
	if _, err := zero.Allow(ctx, "k", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Limiter: %v", err)
	}
	if _, err := rules.New(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("New(nil): %v", err)
	}
	if err := l.Reload(); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("Reload without a file: %v", err)
	}
	if err := l.Watch(ctx, time.Second); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("Watch without a file: %v", err)
	}
}

func TestReserve(t *testing.T) {
	l, clk := newLimiter(t, sample)
	// A bucket reserves ahead.
	for i := 0; i < 20; i++ {
		if res, err := l.Reserve(ctx, "k", 1, 0); err != nil || !res.OK {
			t.Fatalf("reserve %d: %+v %v", i, res, err)
		}
	}
	res, err := l.Reserve(ctx, "k", 1, time.Second)
	if err != nil || !res.OK || res.Delay != 100*time.Millisecond {
		t.Fatalf("reserve ahead: %+v %v", res, err)
	}
	// A window cannot: it answers now or gives a hint.
	for i := 0; i < 5; i++ {
		if res, err := l.Reserve(ctx, "batch-1-nightly", 1, time.Hour); err != nil || !res.OK {
			t.Fatalf("window reserve %d: %+v %v", i, res, err)
		}
	}
	res, err = l.Reserve(ctx, "batch-1-nightly", 1, time.Hour)
	if err != nil || res.OK || res.Delay <= 0 {
		t.Fatalf("full window: %+v %v", res, err)
	}
	if res, err := l.Reserve(ctx, "healthcheck", 1, 0); err != nil || !res.OK {
		t.Fatalf("allow list: %+v %v", res, err)
	}
	if _, err := l.Reserve(ctx, "abuser", 1, 0); !errors.Is(err, throttle.ErrDenied) {
		t.Fatalf("deny list: %v", err)
	}
	// Wait works through Reserve on virtual time.
	clk.Advance(time.Hour)
	if err := throttle.Wait(ctx, l, "k", 1); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, doc string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
}

func bucketDoc(rate string, burst int) string {
	return fmt.Sprintf(`{"default": {"rate": %q, "burst": %d}, "rules": [{"prefix": "w:", "limit": %d, "window": "1m"}]}`, rate, burst, burst)
}

// A reload that changes a limit keeps what keys have used.
func TestReloadKeepsUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	write(t, path, bucketDoc("1/m", 10))
	clk := throttletest.NewClock()
	var hooks []error
	l, err := rules.Open(path, rules.WithLimiterOptions(throttle.WithClock(clk)),
		reloads(func(err error) { hooks = append(hooks, err) }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 6; i++ {
		l.Allow(ctx, "k", 1)
	}
	write(t, path, bucketDoc("1/m", 8))
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	// 6 of 8 used: 2 left, not a fresh 8.
	if got := admitted(t, l, "k"); got != 2 {
		t.Fatalf("after lowering the burst: %d admitted, want 2", got)
	}
	write(t, path, bucketDoc("1/m", 20))
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := admitted(t, l, "k"); got != 12 {
		t.Fatalf("after raising the burst: %d admitted, want 12", got)
	}
	if len(hooks) != 2 || hooks[0] != nil || hooks[1] != nil {
		t.Fatalf("hooks = %v", hooks)
	}
}

// A bad new file is rejected, the old rules stay, the error is reported.
func TestReloadRejectsBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	write(t, path, bucketDoc("1/m", 3))
	var events []throttle.Event
	l, err := rules.Open(path, rules.WithObserver("api", throttle.ObserverFunc(func(e throttle.Event) {
		if e.Kind != throttle.EventDecision && e.Kind != throttle.EventError {
			events = append(events, e)
		}
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(ctx, "k", 1)
	for _, bad := range []string{`{"default": {"rate": "1/m", "burst": 3, "oops": 1}}`, `{`, bucketDoc("0/s", 3)} {
		write(t, path, bad)
		if err := l.Reload(); !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("Reload(%s) = %v", bad, err)
		}
	}
	os.Remove(path)
	if err := l.Reload(); err == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
	if got := admitted(t, l, "k"); got != 2 {
		t.Fatalf("old rules not kept: %d admitted, want 2", got)
	}
	if len(events) != 4 || events[0].Kind != throttle.EventWarning || events[0].Limiter != "api" || events[0].Err == nil {
		t.Fatalf("events = %+v", events)
	}
	// A good file is put in force and reported with its version.
	write(t, path, bucketDoc("1/m", 5))
	if err := l.Reload(); err != nil {
		t.Fatal(err)
	}
	if e := events[len(events)-1]; len(events) != 5 || e.Kind != throttle.EventReload || e.Limiter != "api" || e.Key == "" || e.Key != l.Version() {
		t.Fatalf("after a good reload: events = %+v, version %q", events, l.Version())
	}
}

// A limiter replaced by a reload (the limit changed form) is closed, and a
// rule dropped by a reload is closed too.
func TestReloadReplacesAndCloses(t *testing.T) {
	var mu sync.Mutex
	built, closed := map[string]int{}, map[string]int{}
	factory := func(id string, lim rules.Limit) (throttle.Limiter, error) {
		mu.Lock()
		defer mu.Unlock()
		built[id]++
		return &closer{Limiter: throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
			return throttle.Decision{Allowed: true, Limit: lim.Count + lim.Burst}, nil
		}), onClose: func() { mu.Lock(); closed[id]++; mu.Unlock() }}, nil
	}
	c1, _ := rules.Parse([]byte(`{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "a", "rate": "1/s", "burst": 2}]}`))
	c2, _ := rules.Parse([]byte(`{"default": {"limit": 5, "window": "1s"}}`))
	l, err := rules.New(c1, rules.WithFactory(factory))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(c2); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "a", 1); d.Limit != 5 {
		t.Fatalf("after update: %+v", d)
	}
	mu.Lock()
	if built["default"] != 2 || closed["default"] != 1 || closed[`key "a"`] != 1 {
		t.Fatalf("built %v closed %v", built, closed)
	}
	mu.Unlock()
	l.Close()
	l.Close()
	if closed["default"] != 2 {
		t.Fatalf("Close did not close: %v", closed)
	}
	if _, err := l.Allow(ctx, "a", 1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := l.Update(c1); !errors.Is(err, throttle.ErrClosed) {
		t.Fatalf("Update after Close: %v", err)
	}
}

type closer struct {
	throttle.Limiter
	onClose func()
}

func (c *closer) Close() error { c.onClose(); return nil }

// A factory error leaves the rules in force untouched, including limits
// already adjusted in place for the rejected version.
func TestUpdateAtomic(t *testing.T) {
	l, _ := newLimiter(t, bucketDoc("1/m", 10))
	for i := 0; i < 4; i++ {
		l.Allow(ctx, "k", 1)
	}
	// The default changes (in place), then the window rule fails to build
	// (slidingwindow rejects a limit that large).
	c, err := rules.Parse([]byte(`{"default": {"rate": "1/m", "burst": 5}, "rules": [{"prefix": "w:", "limit": 1000000000, "window": "1m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(c); err == nil {
		t.Fatal("Update with an unbuildable limit succeeded")
	}
	if got := admitted(t, l, "k"); got != 6 {
		t.Fatalf("after the failed update %d admitted, want 6 (burst 10 kept)", got)
	}
}

// Window limits with a QuotaAllower need an explicit factory; bucket
// limits go to the QuotaAllower with the rule's rate and burst.
func TestQuotaAllower(t *testing.T) {
	q := &quotaRecorder{}
	c, _ := rules.Parse([]byte(sample))
	if _, err := rules.New(c, rules.WithQuotaAllower(q)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("window limit without factory: %v", err)
	}
	c, _ = rules.Parse([]byte(`{"default": {"rate": "10/s", "burst": 20}, "rules": [{"prefix": "p:", "rate": "1/m", "burst": 3}]}`))
	l, err := rules.New(c, rules.WithQuotaAllower(q))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Allow(ctx, "p:x", 2)
	l.Allow(ctx, "other", 1)
	want := []string{"p:x 2 1/m 3", "other 1 10/s 20"}
	if fmt.Sprint(q.calls) != fmt.Sprint(want) {
		t.Fatalf("calls = %q, want %q", q.calls, want)
	}
}

type quotaRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (q *quotaRecorder) AllowQuota(_ context.Context, key string, n int, rate throttle.Rate, burst int) (throttle.Decision, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, fmt.Sprintf("%s %d %v %d", key, n, rate, burst))
	return throttle.Decision{Allowed: true, Limit: burst}, nil
}

// Deciding while reloading: no call fails or sees a half-built table, and
// no key is ever given more than the largest burst in play.
func TestReloadRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	write(t, path, bucketDoc("1/h", 10))
	clk := throttletest.NewClock()
	l, err := rules.Open(path, rules.WithLimiterOptions(throttle.WithClock(clk)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var admittedN atomic.Int64
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for _, k := range []string{"k", "w:1"} {
					d, err := l.Allow(ctx, k, 1)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed && k == "k" {
						admittedN.Add(1)
					}
				}
			}
		}()
	}
	docs := []string{bucketDoc("1/h", 10), bucketDoc("1/h", 12), `{"default": {"limit": 3, "window": "1h"}}`, bucketDoc("2/h", 11)}
	for i := 0; i < 100; i++ {
		write(t, path, docs[i%len(docs)])
		if err := l.Reload(); err != nil {
			t.Error(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Each switch to the window form starts afresh (3), each switch back
	// to a bucket too; between them a bucket grows by at most 2.
	if n := admittedN.Load(); n > 100*12 {
		t.Fatalf("admitted %d", n)
	}
}

// Watch picks up a change of the file once it reads the same twice,
// reports a bad one once, and ignores a file caught while being written.
func TestWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = time.Second
		path := filepath.Join(t.TempDir(), "rules.json")
		write(t, path, bucketDoc("1/m", 3))
		var (
			mu      sync.Mutex
			results []error
		)
		l, err := rules.Open(path, reloads(func(err error) {
			mu.Lock()
			defer mu.Unlock()
			results = append(results, err)
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- l.Watch(wctx, every) }()
		defer func() { // a failed test stops Watch too
			if cancel(); done != nil {
				<-done
			}
		}()
		// The test acts half-way between Watch's looks; step lets Watch
		// look n times, then returns what it reported.
		time.Sleep(every / 2)
		step := func(n int) []error {
			t.Helper()
			time.Sleep(time.Duration(n) * every)
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			got := results
			results = nil
			return got
		}
		burst := func() int {
			m, _ := l.Lookup("k")
			return m.Limit.Burst
		}
		if got := step(3); len(got) != 0 {
			t.Fatalf("unchanged file reported %v", got)
		}

		write(t, path, bucketDoc("1/m", 5))
		if got := step(1); len(got) != 0 || burst() != 3 {
			t.Fatalf("a change seen once is acted on: %v, burst %d", got, burst())
		}
		if got := step(1); len(got) != 1 || got[0] != nil || burst() != 5 {
			t.Fatalf("a change seen twice: %v, burst %d", got, burst())
		}

		// Written in place and caught emptied, then half written: neither
		// is rejected, the whole file is put in force.
		whole := bucketDoc("1/m", 6)
		for _, part := range []string{"", whole[:len(whole)/2], whole} {
			write(t, path, part)
			step(1)
		}
		if got := step(1); len(got) != 1 || got[0] != nil || burst() != 6 {
			t.Fatalf("after an in-place write: %v, burst %d", got, burst())
		}

		write(t, path, `{"default": 1}`)
		got := step(5)
		if len(got) != 1 || !errors.Is(got[0], throttle.ErrInvalid) || burst() != 6 {
			t.Fatalf("bad file, reported once: %v, burst %d", got, burst())
		}

		// Renamed away for one look: nothing; missing for two: reported at
		// every look after the first.
		if err := os.Rename(path, path+".old"); err != nil {
			t.Fatal(err)
		}
		if got := step(1); len(got) != 0 {
			t.Fatalf("missing once: %v", got)
		}
		if got := step(2); len(got) != 2 || !errors.Is(got[0], os.ErrNotExist) {
			t.Fatalf("missing thrice: %v", got)
		}

		write(t, path, bucketDoc("1/m", 7))
		if got := step(2); len(got) != 1 || got[0] != nil || burst() != 7 {
			t.Fatalf("fixed file: %v, burst %d", got, burst())
		}
		cancel()
		err = <-done
		if done = nil; !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch returned %v", err)
		}
		if err := l.Watch(ctx, 0); !errors.Is(err, throttle.ErrInvalid) {
			t.Fatalf("Watch(0): %v", err)
		}
	})
}

// A window limiter with SetLimit is adjusted in place when only the limit
// changes, and rebuilt when the window changes.
func TestReloadSetLimit(t *testing.T) {
	built := 0
	factory := func(_ string, lim rules.Limit) (throttle.Limiter, error) {
		built++
		return &settable{limit: lim.Count}, nil
	}
	doc := func(limit int, window string) *rules.Config {
		c, err := rules.Parse([]byte(fmt.Sprintf(`{"default": {"limit": %d, "window": %q}}`, limit, window)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	l, err := rules.New(doc(5, "1m"), rules.WithFactory(factory))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Update(doc(7, "1m")); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Allow(ctx, "k", 1); d.Limit != 7 || built != 1 {
		t.Fatalf("after SetLimit: %+v, built %d", d, built)
	}
	if err := l.Update(doc(7, "1h")); err != nil {
		t.Fatal(err)
	}
	if built != 2 {
		t.Fatalf("a new window did not rebuild: built %d", built)
	}
}

type settable struct {
	mu    sync.Mutex
	limit int
}

func (s *settable) Allow(context.Context, string, int) (throttle.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return throttle.Decision{Allowed: true, Limit: s.limit}, nil
}

func (s *settable) SetLimit(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = n
	return nil
}

// Reloading a window limit keeps what each key used in its window:
// lowering 100/h to 50/h does not hand a key that used 100 another 50. The
// window limiters' SetLimit does it, for the default factory's sliding
// window and for the fixed window.
func TestReloadWindowKeepsUsage(t *testing.T) {
	type windowLimiter interface {
		throttle.Limiter
		SetLimit(int) error
		Capacity() int
	}
	for name, build := range map[string]func(lim rules.Limit, opts ...throttle.Option) (windowLimiter, error){
		"slidingwindow": func(lim rules.Limit, opts ...throttle.Option) (windowLimiter, error) {
			return slidingwindow.New(lim.Count, lim.Window, opts...)
		},
		"slotted": func(lim rules.Limit, opts ...throttle.Option) (windowLimiter, error) {
			return slidingwindow.NewSlotted(lim.Count, lim.Window, 6, opts...)
		},
		"fixedwindow": func(lim rules.Limit, opts ...throttle.Option) (windowLimiter, error) {
			return fixedwindow.New(lim.Count, lim.Window, opts...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			clk := throttletest.NewClock()
			var built []windowLimiter
			factory := func(_ string, lim rules.Limit) (throttle.Limiter, error) {
				l, err := build(lim, throttle.WithClock(clk))
				built = append(built, l)
				return l, err
			}
			doc := func(limit int) *rules.Config {
				c, err := rules.Parse([]byte(fmt.Sprintf(`{"default": {"limit": %d, "window": "1h"}}`, limit)))
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			l, err := rules.New(doc(100), rules.WithFactory(factory))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			steps := []struct{ limit, want int }{
				{100, 100},  // the first hour
				{50, 0},     // lowered: the 100 used stay used
				{120, 20},   // raised: the difference
				{1000, 880}, // past the counters' capacity (127): rebuilt, the 120 used carried over
			}
			for i, s := range steps {
				if i > 0 {
					if err := l.Update(doc(s.limit)); err != nil {
						t.Fatal(err)
					}
				}
				if got := admitted(t, l, "k"); got != s.want {
					t.Fatalf("limit %d: %d admitted, want %d", s.limit, got, s.want)
				}
			}
			if len(built) != 2 || built[0].Capacity() != 127 {
				t.Fatalf("built %d limiters, capacity %d", len(built), built[0].Capacity())
			}
			for _, bad := range []int{0, -1, built[1].Capacity() + 1} {
				if err := built[1].SetLimit(bad); !errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("SetLimit(%d): %v", bad, err)
				}
			}
		})
	}
	var zero slidingwindow.Limiter
	if err := zero.SetLimit(1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("zero Limiter: %v", err)
	}
}

// TestReloadRebuiltWindowKeepsUsage: a window limit rebuilt on reload
// (raised past its counters' capacity, 5 → 10/h; or given another window,
// 1h → 2h) carries over what each key used: a key that used 5 of 5/h gets
// 5 more at 10/h, and none at 5/2h, for the old window's span. Before,
// every key got a fresh window (10 and 5 more).
func TestReloadRebuiltWindowKeepsUsage(t *testing.T) {
	doc := func(limit int, window string) *rules.Config {
		c, err := rules.Parse([]byte(fmt.Sprintf(`{"default": {"limit": %d, "window": %q}}`, limit, window)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		limit  int
		window string
		want   int
	}{{10, "1h", 5}, {5, "2h", 0}, {100, "30m", 95}} {
		clk := throttletest.NewClock()
		l, err := rules.New(doc(5, "1h"), rules.WithLimiterOptions(throttle.WithClock(clk)))
		if err != nil {
			t.Fatal(err)
		}
		if got := admitted(t, l, "k"); got != 5 {
			t.Fatalf("first window: %d admitted", got)
		}
		if err := l.Update(doc(tc.limit, tc.window)); err != nil {
			t.Fatal(err)
		}
		if got := admitted(t, l, "k"); got != tc.want {
			t.Errorf("%d/%s after 5 used of 5/1h: %d admitted, want %d", tc.limit, tc.window, got, tc.want)
		}
		if got := admitted(t, l, "fresh"); got != tc.limit {
			t.Errorf("%d/%s: a new key got %d", tc.limit, tc.window, got)
		}
		l.Close()
	}
}
