package slidinglog

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
	"unsafe"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/limitertest"
	"github.com/throttlekit/throttle/throttletest"
)

// TestMemoryPerKey measures (go test -v) the heap a key holds with k
// entries in its window, and checks the bound docs/design/sliding-log.md states: a
// 128-byte map slot, in tables kept between half and three quarters full
// (171 to 256 bytes a key), up to four entries; past them, a buffer of 8
// bytes per entry that doubles, so at most 16 bytes per entry more.
func TestMemoryPerKey(t *testing.T) {
	if raceOn {
		t.Skip("slow under the race detector, which does not change sizes")
	}
	const keys = 50_000
	ks := make([]string, keys)
	for i := range ks {
		ks[i] = fmt.Sprint("tenant-", i)
	}
	for _, k := range []int{1, 4, 5, 16, 64} {
		clk := throttletest.NewClock()
		perKey := limitertest.HeapPer(keys, func() any {
			l, err := New(1<<20, time.Hour, throttle.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			for range k {
				clk.Advance(time.Microsecond) // one entry per pass: distinct instants
				for _, key := range ks {
					l.Allow(context.Background(), key, 1)
				}
			}
			return l
		})
		t.Logf("%d entries in the window: %.0f B per key", k, perKey)
		limit := 260.0
		if k > len(ring{}.tail) {
			limit += 16 * float64(k) // the buffer: 8 bytes per entry, doubling
		}
		if perKey > limit {
			t.Errorf("%d entries: %.0f B per key, above %.0f", k, perKey, limit)
		}
	}
}

// TestStateSize checks that a key's state is 112 bytes: with the map
// slot's 16-byte header, one aligned pair of cache lines (the keyed map's
// TestWideSlotsAligned checks the alignment).
func TestStateSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are stated for 64-bit platforms")
	}
	if got := unsafe.Sizeof(state{}); got != 112 {
		t.Errorf("state is %d bytes, want 112", got)
	}
}

// TestRoom checks the cap on a log's buffer: an admission is refused
// only when the entries it may add would take the buffer past maxBuf.
func TestRoom(t *testing.T) {
	p, err := newParams(math.MaxInt64, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	full := maxBuf - len(ring{}.tail) // a full tail and one entry more fit exactly
	for _, c := range []struct {
		size int
		n    int64
		want bool
	}{
		{0, 1, true},
		{maxBuf / 2, 1, true},
		{full - 1, 1, true},
		{full, 1, false}, // one entry too many
		{full - 1, int64(p.maxCount), true},
		{full - 1, int64(p.maxCount) + 1, false}, // two entries
		{maxBuf, 1, false},
	} {
		var r ring
		r.setBuffered(0, c.size)
		if got := r.room(&p, c.n); got != c.want {
			t.Errorf("size %d, n %d: room %v, want %v", c.size, c.n, got, c.want)
		}
	}
}
