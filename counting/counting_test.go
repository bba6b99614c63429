package counting

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// badLimits are limits New, NewSemaphore and SetLimit refuse; MaxLimit+1
// is one where int has 64 bits.
var badLimits = func() []int {
	bad := []int{0, -1}
	if big := uint64(MaxLimit) + 1; big <= uint64(^uint(0)>>1) {
		bad = append(bad, int(big))
	}
	return bad
}()

func mustSem(t testing.TB, limit int) *Semaphore {
	t.Helper()
	s, err := NewSemaphore(limit)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustNew(t testing.TB, limit int, opts ...throttle.Option) *Limiter {
	t.Helper()
	l, err := New(limit, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestConformance(t *testing.T) {
	for _, limit := range []int{1, 3, 64} {
		t.Run(fmt.Sprint("Semaphore", limit), func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New:   func(t testing.TB, _ *throttletest.Clock) throttle.Limiter { return mustSem(t, limit) },
				Limit: limit,
				Bound: func(d time.Duration) int64 { return int64(limit) }, // nothing is released
				Release: func(l throttle.Limiter, _ string, n int) {
					if err := l.(*Semaphore).Release(n); err != nil {
						panic(err)
					}
				},
				Single: true,
			})
		})
		t.Run(fmt.Sprint("Limiter", limit), func(t *testing.T) {
			throttletest.Run(t, throttletest.Suite{
				New:   func(t testing.TB, _ *throttletest.Clock) throttle.Limiter { return mustNew(t, limit) },
				Limit: limit,
				Bound: func(d time.Duration) int64 { return int64(limit) },
				Release: func(l throttle.Limiter, key string, n int) {
					if err := l.(*Limiter).Release(key, n); err != nil {
						panic(err)
					}
				},
			})
		})
	}
}

// both runs f against a Semaphore and a key of a Limiter, through a
// common interface.
type iface interface {
	try(n int) bool
	acquire(ctx context.Context, n int) (func(), error)
	release(n int) error
	setLimit(n int) error
	inFlight() int
	allow(n int) (throttle.Decision, error)
}

type semI struct{ *Semaphore }

func (s semI) try(n int) bool                                     { d, err := s.AllowN(n); return err == nil && d.Allowed }
func (s semI) acquire(ctx context.Context, n int) (func(), error) { return s.Hold(ctx, "", n) }
func (s semI) release(n int) error                                { return s.Release(n) }
func (s semI) setLimit(n int) error                               { return s.SetLimit(n) }
func (s semI) inFlight() int                                      { return s.InFlight() }
func (s semI) allow(n int) (throttle.Decision, error)             { return s.AllowN(n) }
func (l limI) try(n int) bool {
	d, err := l.Allow(context.Background(), "k", n)
	return err == nil && d.Allowed
}
func (l limI) acquire(ctx context.Context, n int) (func(), error) { return l.Hold(ctx, "k", n) }
func (l limI) release(n int) error                                { return l.Release("k", n) }
func (l limI) setLimit(n int) error                               { return l.SetLimit(n) }
func (l limI) inFlight() int                                      { return l.InFlight("k") }
func (l limI) allow(n int) (throttle.Decision, error)             { return l.Allow(context.Background(), "k", n) }

type limI struct{ *Limiter }

func both(t *testing.T, limit int, f func(t *testing.T, s iface)) {
	t.Run("Semaphore", func(t *testing.T) { f(t, semI{mustSem(t, limit)}) })
	t.Run("Limiter", func(t *testing.T) { f(t, limI{mustNew(t, limit)}) })
}

// started runs f in a goroutine and waits (in a synctest bubble) until it
// returns or blocks; the result arrives on the returned channel.
func started(f func() error) chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	synctest.Wait()
	return c
}

func pending(c chan error) bool { return len(c) == 0 }

func TestFIFO(t *testing.T) {
	both(t, 10, func(t *testing.T, s iface) {
		synctest.Test(t, func(t *testing.T) {
			if !s.try(9) {
				t.Fatal("AllowN(9) failed on an empty semaphore")
			}
			big := started(func() error { _, err := s.acquire(t.Context(), 5); return err })
			small := started(func() error { _, err := s.acquire(t.Context(), 1); return err })
			if !pending(big) || !pending(small) {
				t.Fatal("waiters did not wait")
			}
			// 1 unit is free, but the big waiter is first: nobody overtakes it.
			if s.try(1) {
				t.Fatal("AllowN(1) overtook a queued waiter")
			}
			if d, err := s.allow(1); err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("Allow with a queue = %+v, %v; want denied, Remaining 0", d, err)
			}
			if err := s.release(4); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if pending(big) || !pending(small) || s.inFlight() != 10 {
				t.Fatalf("after release of 4: big done %v, small done %v, in flight %d; want the big one only, 10", !pending(big), !pending(small), s.inFlight())
			}
			if err := s.release(1); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if pending(small) || s.inFlight() != 10 {
				t.Fatalf("small waiter not served: in flight %d", s.inFlight())
			}
			if err := errors.Join(<-big, <-small); err != nil {
				t.Fatal(err)
			}
			// Queue empty again: the fast path is back.
			if err := s.release(10); err != nil || !s.try(10) {
				t.Fatalf("release all, AllowN(10): %v", err)
			}
		})
	})
}

func TestCancel(t *testing.T) {
	both(t, 10, func(t *testing.T, s iface) {
		synctest.Test(t, func(t *testing.T) {
			s.try(9)
			ctx, cancel := context.WithCancel(t.Context())
			big := started(func() error { _, err := s.acquire(ctx, 5); return err })
			small := started(func() error { _, err := s.acquire(t.Context(), 1); return err })
			cancel() // the head leaves: the one behind it fits and is served
			synctest.Wait()
			if err := <-big; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled waiter: %v", err)
			}
			if err := <-small; err != nil || s.inFlight() != 10 {
				t.Fatalf("waiter behind a cancelled head: %v, in flight %d", err, s.inFlight())
			}
			// A done ctx fails even when the units are free.
			s.release(10)
			if _, err := s.acquire(ctx, 1); !errors.Is(err, context.Canceled) || s.inFlight() != 0 {
				t.Fatalf("Hold with a done ctx: %v, in flight %d", err, s.inFlight())
			}
		})
	})
}

func TestReleaseFunc(t *testing.T) {
	both(t, 3, func(t *testing.T, s iface) {
		rel, err := s.acquire(t.Context(), 2)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		rel()
		if got := s.inFlight(); got != 0 {
			t.Fatalf("in flight after release func twice: %d, want 0", got)
		}
		s.try(3)
		rel() // must not release the units taken since
		if got := s.inFlight(); got != 3 {
			t.Fatalf("in flight %d, want 3", got)
		}
	})
}

func TestOverRelease(t *testing.T) {
	both(t, 5, func(t *testing.T, s iface) {
		s.try(2)
		for _, n := range []int{3, 0, -1} {
			if err := s.release(n); !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("Release(%d) with 2 held: %v, want ErrInvalid", n, err)
			}
		}
		if got := s.inFlight(); got != 2 {
			t.Fatalf("a failed release changed the count: %d", got)
		}
	})
	l := mustNew(t, 5)
	if err := l.Release("nobody", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Release on an unknown key: %v", err)
	}
}

func TestSetLimit(t *testing.T) {
	both(t, 6, func(t *testing.T, s iface) {
		synctest.Test(t, func(t *testing.T) {
			s.try(6)
			a := started(func() error { _, err := s.acquire(t.Context(), 3); return err })
			b := started(func() error { _, err := s.acquire(t.Context(), 6); return err })
			c := started(func() error { _, err := s.acquire(t.Context(), 2); return err })
			if err := s.setLimit(9); err != nil { // a fits now; b is next and does not
				t.Fatal(err)
			}
			synctest.Wait()
			if pending(a) || !pending(b) || !pending(c) || s.inFlight() != 9 {
				t.Fatalf("after SetLimit(9): a done %v, b done %v, c done %v, in flight %d", !pending(a), !pending(b), !pending(c), s.inFlight())
			}
			if err := s.setLimit(5); err != nil { // b can never fit: it fails; c waits
				t.Fatal(err)
			}
			synctest.Wait()
			if err := <-b; !errors.Is(err, throttle.ErrExceedsLimit) {
				t.Fatalf("waiter above a lowered limit: %v", err)
			}
			// 9 held above the limit 5: nothing is granted until below it.
			if s.try(1) || !pending(c) {
				t.Fatal("granted above a lowered limit")
			}
			s.release(6) // 3 held; c's 2 fit
			synctest.Wait()
			if err := errors.Join(<-a, <-c); err != nil || s.inFlight() != 5 {
				t.Fatalf("%v, in flight %d", err, s.inFlight())
			}
			if _, err := s.acquire(t.Context(), 6); !errors.Is(err, throttle.ErrExceedsLimit) {
				t.Fatalf("Hold above the limit: %v", err)
			}
			for _, bad := range badLimits {
				if err := s.setLimit(bad); !errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("SetLimit(%d): %v", bad, err)
				}
			}
		})
	})
}

func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2)
		rel, _ := l.Hold(t.Context(), "k", 2)
		w := started(func() error { _, err := l.Hold(t.Context(), "k", 1); return err })
		l.Close()
		synctest.Wait()
		if err := <-w; !errors.Is(err, throttle.ErrClosed) {
			t.Fatalf("waiter at Close: %v", err)
		}
		if _, err := l.Hold(t.Context(), "k", 1); !errors.Is(err, throttle.ErrClosed) {
			t.Fatalf("Hold after Close: %v", err)
		}
		rel() // holders can still give back
		if l.InFlight("k") != 0 {
			t.Fatal("release after Close did nothing")
		}
	})
}

func TestBadInput(t *testing.T) {
	for _, limit := range badLimits {
		if _, err := New(limit); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("New(%d): %v", limit, err)
		}
		if _, err := NewSemaphore(limit); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("NewSemaphore(%d): %v", limit, err)
		}
	}
	if _, err := New(1, nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("New with a nil option: %v", err)
	}
	both(t, 3, func(t *testing.T, s iface) {
		for _, c := range []struct {
			n    int
			want error
		}{{0, throttle.ErrInvalid}, {-1, throttle.ErrInvalid}, {4, throttle.ErrExceedsLimit}} {
			if _, err := s.acquire(t.Context(), c.n); !errors.Is(err, c.want) {
				t.Errorf("Hold(%d): %v, want %v", c.n, err, c.want)
			}
			if s.try(c.n) {
				t.Errorf("AllowN(%d) succeeded", c.n)
			}
		}
		if s.inFlight() != 0 {
			t.Fatal("bad requests took units")
		}
	})
	l := mustNew(t, 3, throttle.WithMaxKeyLen(4))
	if _, err := l.Hold(t.Context(), "", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("Hold with an empty key: %v", err)
	}
	if _, err := l.Hold(t.Context(), "12345", 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("Hold with a long key: %v", err)
	}
}

// TestIdleKeysHoldNothing: a key with nothing in flight is dropped; a key
// holding units is never dropped, not even past MaxKeys.
func TestIdleKeysHoldNothing(t *testing.T) {
	l := mustNew(t, 2, throttle.WithMaxKeys(64))
	for i := range 1000 {
		if d, _ := l.Allow(t.Context(), fmt.Sprint(i), 1); !d.Allowed {
			t.Fatalf("key %d denied", i)
		}
	}
	if l.Len() != 1000 || l.m.Evictions() != 0 {
		t.Fatalf("Len %d, evictions %d; want all 1000 keys kept (they hold units)", l.Len(), l.m.Evictions())
	}
	for i := range 1000 {
		if i%2 == 0 {
			if err := l.Release(fmt.Sprint(i), 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := l.Sweep(); n != 500 || l.Len() != 500 {
		t.Fatalf("Sweep dropped %d, Len %d; want 500, 500", n, l.Len())
	}
	for i := range 1000 {
		want := 1 - i%2
		if d, _ := l.Allow(t.Context(), fmt.Sprint(i), 2); d.Allowed != (want == 1) {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
}

// TestModel compares random non-blocking operations with a plain counter.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	both(t, 8, func(t *testing.T, s iface) {
		limit, cur := 8, 0
		for i := range 20000 {
			n := 1 + rng.IntN(limit+2)
			switch rng.IntN(5) {
			case 0, 1:
				d, err := s.allow(n)
				ok := n <= limit && cur+n <= limit
				if n > limit {
					if !errors.Is(err, throttle.ErrExceedsLimit) {
						t.Fatalf("step %d: Allow(%d) above limit %d: %v", i, n, limit, err)
					}
					continue
				}
				if ok {
					cur += n
				}
				if d.Allowed != ok || d.Remaining != max(0, limit-cur) || d.Limit != limit {
					t.Fatalf("step %d: Allow(%d) = %+v with %d of %d held", i, n, d, cur, limit)
				}
			case 2, 3:
				err := s.release(n)
				if ok := n <= cur; ok != (err == nil) {
					t.Fatalf("step %d: Release(%d) with %d held: %v", i, n, cur, err)
				} else if ok {
					cur -= n
				}
			case 4:
				limit = 1 + rng.IntN(12)
				if err := s.setLimit(limit); err != nil {
					t.Fatal(err)
				}
			}
			if s.inFlight() != cur {
				t.Fatalf("step %d: in flight %d, want %d", i, s.inFlight(), cur)
			}
		}
	})
}

// TestStress runs many goroutines acquiring (blocking with cancellation,
// and not), releasing and changing the limit on a few keys, counting what
// each key holds: at no instant may it exceed the largest limit in force,
// and at the end everything is released and every key is dropped.
func TestStress(t *testing.T) {
	const workers, rounds = 32, 400
	l := mustNew(t, 8, throttle.WithMaxKeys(2))
	sem := mustSem(t, 8)
	keys := []string{"a", "b", "c"}
	var held [4]atomic.Int64 // per key; [3] is the Semaphore
	var maxLimit atomic.Int64
	maxLimit.Store(8)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range rounds {
				k := rng.IntN(4)
				n := 1 + rng.IntN(4)
				var rel func()
				switch rng.IntN(4) {
				case 0: // non-blocking
					var ok bool
					if k == 3 {
						d, err := sem.AllowN(n)
						ok = err == nil && d.Allowed
					} else {
						d, err := l.Allow(t.Context(), keys[k], n)
						ok = err == nil && d.Allowed
					}
					if ok {
						rel = func() {
							var err error
							if k == 3 {
								err = sem.Release(n)
							} else {
								err = l.Release(keys[k], n)
							}
							if err != nil {
								t.Error(err)
							}
						}
					}
				case 3: // the limit moves between 4 and 8
					lim := 4 + rng.IntN(5)
					if k == 3 {
						sem.SetLimit(lim)
					} else {
						l.SetLimit(lim)
					}
					continue
				default: // blocking, sometimes cancelled by another goroutine
					ctx, cancel := context.WithCancel(t.Context())
					if rng.IntN(3) == 0 {
						go cancel()
					}
					var err error
					if k == 3 {
						rel, err = sem.Hold(ctx, "", n)
					} else {
						rel, err = l.Hold(ctx, keys[k], n)
					}
					cancel()
					if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, throttle.ErrExceedsLimit) {
						t.Error(err)
					}
				}
				if rel == nil {
					continue
				}
				if h := held[k].Add(int64(n)); h > maxLimit.Load() {
					t.Errorf("key %d holds %d units", k, h)
				}
				held[k].Add(-int64(n))
				rel()
			}
		})
	}
	wg.Wait()
	for k := range keys {
		if got := l.InFlight(keys[k]); got != 0 {
			t.Errorf("key %s: %d in flight after all released", keys[k], got)
		}
	}
	if sem.InFlight() != 0 {
		t.Errorf("semaphore: %d in flight after all released", sem.InFlight())
	}
	l.Sweep()
	if l.Len() != 0 {
		t.Errorf("%d keys left after all released", l.Len())
	}
}

// TestNoAllocs: non-blocking acquire and release, allowed or denied, do
// not allocate.
func TestNoAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates")
	}
	sem := mustSem(t, 2)
	l := mustNew(t, 2)
	l.Allow(t.Context(), "k", 1)
	step := func() {
		sem.AllowN(2)
		sem.AllowN(1) // denied
		sem.AllowN(1) // denied
		sem.Release(2)
		l.Allow(t.Context(), "k", 1)
		l.Allow(t.Context(), "k", 1) // denied
		l.Release("k", 1)
	}
	if a := testing.AllocsPerRun(1000, step); a != 0 {
		t.Fatalf("%v allocations per step, want 0", a)
	}
}

// TestTraces replays deterministic arrivals on a tick clock: each admitted
// request holds its units for a fixed number of ticks.
func TestTraces(t *testing.T) {
	type req struct{ tick, n int }
	run := func(s iface, ticks, perTick, n, hold int, on func(tick int) bool) (admits []int) {
		var held []req
		for tick := range ticks {
			kept := held[:0]
			for _, h := range held {
				if h.tick+hold == tick {
					if err := s.release(h.n); err != nil {
						t.Fatal(err)
					}
				} else {
					kept = append(kept, h)
				}
			}
			held = kept
			got := 0
			for range perTick {
				if !on(tick) {
					break
				}
				if d, err := s.allow(n); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					held = append(held, req{tick, n})
					got++
				}
			}
			admits = append(admits, got)
		}
		return admits
	}
	always := func(int) bool { return true }
	both(t, 4, func(t *testing.T, s iface) {
		// Steady over-rate: 3 arrivals a tick, each held 2 ticks, limit 4:
		// 3 admitted, then only the 1 left, and so on.
		for tick, got := range run(s, 100, 3, 1, 2, always) {
			if want := 3 - 2*(tick%2); got != want {
				t.Fatalf("steady: tick %d admitted %d, want %d", tick, got, want)
			}
		}
	})
	both(t, 4, func(t *testing.T, s iface) {
		// Bursty on/off: 10 arrivals every 5th tick, each held 3 ticks: a
		// burst finds the last one released and admits exactly 4.
		for tick, got := range run(s, 100, 10, 1, 3, func(tick int) bool { return tick%5 == 0 }) {
			if want := 4 * btoi(tick%5 == 0); got != want {
				t.Fatalf("bursty: tick %d admitted %d, want %d", tick, got, want)
			}
		}
	})
	both(t, 4, func(t *testing.T, s iface) {
		// Weighted: requests of 3 against a limit of 4 never overlap; each
		// held 2 ticks, so one is admitted every other tick.
		for tick, got := range run(s, 100, 2, 3, 2, always) {
			if want := 1 - tick%2; got != want {
				t.Fatalf("weighted: tick %d admitted %d, want %d", tick, got, want)
			}
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BenchmarkPastMaxKeys: each new key past MaxKeys, with every held key
// refusing eviction, costs O(1), not a scan of the keys held.
func BenchmarkPastMaxKeys(b *testing.B) {
	for _, held := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			l, ctx := mustNew(b, 1, throttle.WithMaxKeys(128)), context.Background()
			for i := range held {
				l.Allow(ctx, "h"+strconv.Itoa(i), 1)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				l.Allow(ctx, "n"+strconv.Itoa(i), 1)
				i++
			}
		})
	}
}
