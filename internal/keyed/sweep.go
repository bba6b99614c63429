package keyed

import (
	"time"
)

// Dropping keys whose state is full: a few slots per insert, Sweep, the sweeper.

// Now reads the clock for a clean-up of sh and records the reading as the
// shard's latest judged instant; sh.mu must be held. It implements Judge.
func (sh *shard[S]) Now() int64 {
	t := sh.clk.Now()
	if t > sh.judged.Load() {
		sh.judged.Store(t)
	}
	return t
}

// remove drops the key of sl, a live slot of sh's table; sh.mu must be
// held and sl's state dead.
func (sh *shard[S]) remove(sl *slot[S]) {
	sl.tag.Store(gone)
	sh.n--
	sh.keys.Add(-1)
}

// sweepLook is how many slots an insert examines for idle states.
const sweepLook = 4

// sweepSome examines up to k slots of sh's table for idle states; sh.mu
// must be held.
func (m *Map[S, P]) sweepSome(sh *shard[S], k int) {
	t := sh.tab.Load()
	for ; k > 0; k-- {
		if sh.sweep++; sh.sweep >= len(t.slots) {
			sh.sweep = 0
		}
		sl := &t.slots[sh.sweep]
		if sl.tag.Load()&liveBit != 0 && P(&sl.state).Retire(sh, false) {
			sh.remove(sl)
		}
	}
}

// Sweep drops every key whose state is full and returns how many it
// dropped. A table left less than an eighth full is rebuilt smaller.
func (m *Map[S, P]) Sweep() int {
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		t := sh.tab.Load()
		for sl := range t.live {
			if P(&sl.state).Retire(sh, false) {
				sh.remove(sl)
				dropped++
			}
		}
		if len(t.slots) > minTable && 8*sh.n < len(t.slots) {
			m.rebuild(sh) // give back the memory of a flood that has passed
		}
		sh.mu.Unlock()
	}
	return dropped
}

func (m *Map[S, P]) sweeper(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}
