package gossip

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// TestTable inserts keys through several rebuilds, drops half of them and
// checks what load and each then see: every live key its own entry, no
// dropped key, and a dropped key back with a new entry.
func TestTable(t *testing.T) {
	var tb table
	tb.init(1 << 20)
	const n = 5000
	entries := make([]*entry, n)
	for i := range n {
		entries[i] = tb.get("k" + strconv.Itoa(i))
	}
	for i := 0; i < n; i += 2 {
		tb.drop("k"+strconv.Itoa(i), entries[i], func() bool { return true })
	}
	if got := tb.n.Load(); got != n/2 {
		t.Fatalf("count %d after dropping half of %d", got, n)
	}
	seen := map[string]*entry{}
	tb.each(func(k string, e *entry) { seen[k] = e })
	for i := range n {
		k := "k" + strconv.Itoa(i)
		got := tb.load(k)
		switch {
		case i%2 == 0 && (got != nil || seen[k] != nil):
			t.Fatalf("%s dropped, still found", k)
		case i%2 == 1 && (got != entries[i] || seen[k] != entries[i]):
			t.Fatalf("%s: load %p, each %p, want %p", k, got, seen[k], entries[i])
		}
	}
	if len(seen) != n/2 {
		t.Fatalf("each visited %d entries, want %d", len(seen), n/2)
	}
	if e := tb.get("k0"); e == nil || e == entries[0] {
		t.Fatalf("k0 back: %p, want a new entry", e)
	}
}

// TestTableReadersDuringRebuilds looks keys up from several goroutines
// while another inserts enough keys to rebuild the table many times: a
// look-up must find its key's one entry every time. Run it with -race.
func TestTableReadersDuringRebuilds(t *testing.T) {
	var tb table
	tb.init(1 << 20)
	hot := make([]*entry, 64)
	for i := range hot {
		hot[i] = tb.get("hot" + strconv.Itoa(i))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := w; !stop.Load(); i++ {
				k := i % len(hot)
				if e := tb.load("hot" + strconv.Itoa(k)); e != hot[k] {
					t.Errorf("hot%d: %p, want %p", k, e, hot[k])
					return
				}
			}
		})
	}
	for i := range 20_000 {
		tb.get("cold" + strconv.Itoa(i))
	}
	stop.Store(true)
	wg.Wait()
}
