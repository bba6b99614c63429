package counting

import (
	"errors"
	"testing"

	"github.com/throttlekit/throttle"
)

// FuzzBound drives a Semaphore and a key of a Limiter with fuzzed
// non-blocking acquires, releases and limit changes, against a plain
// counter: units in flight never exceed the limit through an acquire, a
// release of more than is held fails and changes nothing, and Remaining
// is exact.
func FuzzBound(f *testing.F) {
	f.Add(uint8(4), []byte{0, 3, 0, 2, 1, 9, 1, 3, 2, 1, 0, 1})
	f.Add(uint8(1), []byte{0, 1, 0, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, limit8 uint8, ops []byte) {
		limit := 1 + int(limit8%64)
		sem := mustSem(t, limit)
		lim := mustNew(t, limit)
		targets := []iface{semI{sem}, limI{lim}}
		cur := 0
		for i := 0; i+1 < len(ops); i += 2 {
			n := int(ops[i+1]%80) - 4 // some bad n
			switch ops[i] % 3 {
			case 0:
				want := n > 0 && n <= limit && cur+n <= limit
				for _, s := range targets {
					d, err := s.allow(n)
					switch {
					case n <= 0 && !errors.Is(err, throttle.ErrInvalid),
						n > limit && !errors.Is(err, throttle.ErrExceedsLimit),
						d.Allowed != want:
						t.Fatalf("op %d: Allow(%d) = %+v, %v with %d of %d held", i/2, n, d, err, cur, limit)
					}
					after := cur
					if want {
						after += n
					}
					if err == nil && d.Remaining != max(0, limit-after) {
						t.Fatalf("op %d: Allow(%d) = %+v with %d of %d held", i/2, n, d, cur, limit)
					}
				}
				if want {
					cur += n
				}
			case 1:
				ok := n > 0 && n <= cur
				for _, s := range targets {
					if err := s.release(n); (err == nil) != ok || (err != nil && !errors.Is(err, throttle.ErrInvalid)) {
						t.Fatalf("op %d: Release(%d) with %d held: %v", i/2, n, cur, err)
					}
				}
				if ok {
					cur -= n
				}
			case 2:
				err := errors.Join(sem.SetLimit(n), lim.SetLimit(n))
				if (err == nil) != (n > 0) {
					t.Fatalf("op %d: SetLimit(%d): %v", i/2, n, err)
				}
				if n > 0 {
					limit = n
				}
			}
			for _, s := range targets {
				if s.inFlight() != cur {
					t.Fatalf("op %d: in flight %d, want %d", i/2, s.inFlight(), cur)
				}
			}
		}
	})
}
