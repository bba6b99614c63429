package keyed

import (
	"fmt"
	"testing"

	"github.com/throttlekit/throttle"
)

// FuzzMap runs a sequence of operations on a map of pinned states (they
// refuse eviction while held) beside a model, and checks after each one
// that every held key still has exactly its units, wherever inserts,
// sweeps, evictions and table rebuilds moved it, and that the key count
// is right. Each step is two bytes: the operation and a key or a count.
func FuzzMap(f *testing.F) {
	f.Add(uint8(4), []byte{0, 1, 0, 1, 0, 2, 3, 200, 1, 1, 2, 0, 0, 1})
	f.Add(uint8(0), []byte{0, 0, 3, 255, 3, 255, 0, 0, 2, 0, 1, 0, 2, 0})
	f.Fuzz(func(t *testing.T, maxKeys uint8, steps []byte) {
		opts := []throttle.Option{}
		if maxKeys > 0 {
			opts = append(opts, throttle.WithMaxKeys(int(maxKeys)))
		}
		m := newMap[pinned](t, opts...)
		held := map[string]int64{} // the model: units held per key
		oneOff := 0
		for i := 0; i+1 < len(steps); i += 2 {
			op, arg := steps[i]%4, steps[i+1]
			key := fmt.Sprint("k", arg%32)
			switch op {
			case 0: // take a unit
				for p, _ := m.Get(key, 0); !p.acquire(); p, _ = m.Again(key, 0) {
				}
				held[key]++
			case 1: // give one back
				if held[key] == 0 {
					continue
				}
				for p, _ := m.Get(key, 0); !p.release(); p, _ = m.Again(key, 0) {
				}
				held[key]--
			case 2:
				m.Sweep()
			case 3: // one-off keys: idle, swept lazily, their slots gone
				for range int(arg) {
					oneOff++
					m.Get(fmt.Sprint("once", oneOff), 0)
				}
			}
			busy := 0
			for k, n := range held {
				got := int64(0)
				if p := m.Load(k); p != nil {
					got = p.n.Load()
				}
				if got != n {
					t.Fatalf("step %d: key %s holds %d units, want %d", i/2, k, got, n)
				}
				if n > 0 {
					busy++
				}
			}
			if m.Len() < busy {
				t.Fatalf("step %d: Len %d with %d keys holding units", i/2, m.Len(), busy)
			}
			if op == 2 && m.Len() != busy {
				t.Fatalf("after Sweep: Len %d, want %d", m.Len(), busy)
			}
			if m.Evictions() != 0 {
				t.Fatalf("step %d: %d held keys evicted", i/2, m.Evictions())
			}
		}
	})
}
