package keyed

import (
	"unsafe"

	"github.com/throttlekit/throttle/internal/limiterkit"
)

// Look-ups (Get and its variants), and the decisions built on them.

// Get returns the state of key, inserting a fresh zero state if the key is
// absent, and the instant the caller must decide at: now, the caller's
// clock reading, or the later instant a clean-up of the key's shard judged
// a state idle at. The state may be retired or moved concurrently at any
// time; the caller then calls Again with the instant it got.
func (m *Map[S, P]) Get(key string, now int64) (P, int64) {
	sh, tag := m.locate(key)
	return m.get(sh, tag, key, now)
}

// GetNow is Get at the current time, the clock read once. The key is
// hashed first: hashing then overlaps the clock's read, which waits for
// the loads before it to complete. Once the tables have outgrown the
// caches near a core (cold), the key's home slot is also prefetched
// before the clock is read: the clock's read waits for earlier loads to
// complete (lfence or rdtscp on amd64), not for a prefetch, so the slot's
// cache miss and the clock's read take their time together instead of one
// after the other. A map small enough to stay in cache skips the
// prefetch, which there would only cost a call.
func (m *Map[S, P]) GetNow(key string) (P, int64) {
	sh, tag := m.locate(key)
	if m.cold.Load() {
		t := sh.tab.Load()
		sl := &t.slots[t.home(tag)]
		prefetch(unsafe.Pointer(sl))
		if unsafe.Sizeof(*sl) > cacheLine { // the sliding log's pair of lines
			prefetch(unsafe.Add(unsafe.Pointer(sl), cacheLine))
		}
	}
	return m.get(sh, tag, key, m.clk.Now())
}

// get is Get once the key is located.
func (m *Map[S, P]) get(sh *shard[S], tag uint64, key string, now int64) (P, int64) {
	var p P
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		p = &sl.state
	} else {
		p = m.insert(sh, tag, key)
	}
	if j := sh.judged.Load(); j > now {
		now = j
	}
	return p, now
}

// Again is Get for a caller whose state turned out dead: it first waits
// for the writer of key's shard, which may be moving the shard's states to
// a new table, so that the caller does not spin on the moved state.
func (m *Map[S, P]) Again(key string, now int64) (P, int64) {
	m.wait(key)
	return m.Get(key, now)
}

// LoadAgain is Load for a caller whose state turned out dead, as Again.
func (m *Map[S, P]) LoadAgain(key string) P {
	m.wait(key)
	return m.Load(key)
}

// wait waits for the writer of key's shard, if any.
func (m *Map[S, P]) wait(key string) {
	sh, _ := m.locate(key)
	sh.mu.Lock()
	//lint:ignore SA2001 an empty critical section: waiting for the writer is the point
	sh.mu.Unlock()
}

// Begin does what every keyed decision does first: it checks that the map
// is open, the key, and n against limit (see limiterkit.CheckN), reads the
// clock once, and returns key's state and the instant to decide at (see
// Get). If the state turns out dead, the caller calls Again(key, now).
func (m *Map[S, P]) Begin(key string, n, limit int) (P, int64, error) {
	if err := m.Check(key); err != nil {
		return nil, 0, err
	}
	if n <= 0 || n > limit {
		return nil, 0, limiterkit.CheckN(n, limit)
	}
	p, now := m.GetNow(key)
	return p, now, nil
}

// Decide is a keyed decision whole: Begin, then step on key's state
// until step finds it live, taking the state again (Again) each time it
// was dead. step reports whether the state was live, and the decision's
// error; it must decide nothing on a dead state. Errors are Begin's or
// step's.
func (m *Map[S, P]) Decide(key string, n, limit int, step func(s P, now int64) (live bool, err error)) error {
	s, now, err := m.Begin(key, n, limit)
	if err != nil {
		return err
	}
	return m.Retry(key, s, now, step)
}

// Retry calls step on s at now, then, while step finds the state dead,
// on key's state taken again (Again); it returns step's error.
func (m *Map[S, P]) Retry(key string, s P, now int64, step func(s P, now int64) (live bool, err error)) error {
	for {
		if live, err := step(s, now); live {
			return err
		}
		s, now = m.Again(key, now)
	}
}

// Load returns the state of key, or nil if the key is absent.
func (m *Map[S, P]) Load(key string) P {
	sh, tag := m.locate(key)
	if sl := sh.tab.Load().find(tag, key, m.ids); sl != nil {
		return &sl.state
	}
	return nil
}
