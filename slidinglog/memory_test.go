package slidinglog

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
)

// TestMemoryPerKey measures (go test -v) the heap a key holds with k
// entries in its window, and checks the bound the README states: about
// 200 bytes up to four entries; past them, a buffer of 8 bytes per entry
// that doubles, so at most 16 bytes per entry more.
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
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
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
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(l)
		perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / keys
		t.Logf("%d entries in the window: %.0f B per key", k, perKey)
		limit := 240.0
		if k > len(ring{}.tail) {
			limit += 16 * float64(k) // the buffer: 8 bytes per entry, doubling
		}
		if perKey > limit {
			t.Errorf("%d entries: %.0f B per key, above %.0f", k, perKey, limit)
		}
	}
}
