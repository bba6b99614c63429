package gossip

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
)

// checkBound fails t for every key that admitted more than bound, and
// returns the most any key admitted.
func checkBound(t *testing.T, what string, admitted map[string]int64, keys []string, bound int64) (most int64) {
	t.Helper()
	for _, k := range keys {
		most = max(most, admitted[k])
		if admitted[k] > bound {
			t.Errorf("%s: %s admitted %d, bound %d", what, k, admitted[k], bound)
		}
	}
	return most
}

// A node that hears no majority of the members decides every key on its
// fallback bucket (rate and burst / N), so that a partition of any shape
// keeps each key within the fault bound of owner routing: one bucket on
// the owner plus a fallback bucket on each other node. Each side of a cut
// took every key as its own after the silence rule (4 intervals): two
// and three buckets per key.
func TestOwnedPartitionNoMajority(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers bool // Config.Peers, else a Membership that reports every member alive
		cut   [][]string
	}{
		{"two-way/membership", false, [][]string{{"n0"}, {"n1", "n2"}}},
		{"two-way/peers", true, [][]string{{"n0"}, {"n1", "n2"}}},
		{"three-way/membership", false, [][]string{{"n0"}, {"n1"}, {"n2"}}},
		{"three-way/peers", true, [][]string{{"n0"}, {"n1"}, {"n2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rate, burst := throttle.PerSecond(10), 6
				c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 5, peers: tc.peers})
				c.net.Partition(tc.cut...)
				keys := keyNames(30)
				const d = 3 * time.Second
				admitted := c.load(t, keys, rate, d, 5)
				bound := fallbackBound(rate, burst, 3, d)
				most := checkBound(t, tc.name, admitted, keys, bound)
				t.Logf("most admitted for a key %d, one bucket %d, bound %d; %+v", most, int64(burst)+rate.Events(d), bound, c.stats())
			})
		})
	}
}

// A node sealing under a wrong key hears nobody and is heard by nobody: it
// decides on its fallback buckets, the others on their owners'.
func TestOwnedWrongKeyNoMajority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(10), 6
		wrap := func(i int, tr Transport) Transport {
			key := bytes.Repeat([]byte{1}, 32)
			if i == 0 {
				key = bytes.Repeat([]byte{2}, 32)
			}
			s, err := Seal(tr, newRing(key))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 6, peers: true, wrap: wrap})
		keys := keyNames(30)
		const d = 3 * time.Second
		admitted := c.load(t, keys, rate, d, 6)
		bound := fallbackBound(rate, burst, 3, d)
		most := checkBound(t, "wrong key", admitted, keys, bound)
		t.Logf("most admitted for a key %d, bound %d; %+v", most, bound, c.stats())
	})
}

// After a partition heals, each node charges the keys' owners what it
// admitted on its fallback buckets, as all-to-all charges what the others
// admitted: over the cut and the payback, a key admits about one bucket,
// not one bucket plus what the fallbacks admitted.
func TestOwnedPartitionPaidBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(10), 6
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 7})
		keys := keyNames(30)
		c.net.Partition([]string{"n0"}, []string{"n1", "n2"})
		const cut, after = 3 * time.Second, 6 * time.Second
		admitted := c.load(t, keys, rate, cut, 7)
		c.net.Heal()
		for k, v := range c.load(t, keys, rate, after, 8) {
			admitted[k] += v
		}
		st := c.stats()
		// One bucket over the whole run, plus what the fallback buckets
		// admitted and was not charged yet: their bursts, and the last
		// interval's.
		fb := int64(max(1, burst/3)) + rate.Events(c.nodes[0].Interval())/3 + 1
		bound := int64(burst) + rate.Events(cut+after) + 2*fb
		most := checkBound(t, "paid back", admitted, keys, bound)
		if st.Charged == 0 {
			t.Errorf("nothing charged: %+v", st)
		}
		t.Logf("most admitted for a key %d, one bucket %d, bound %d; %+v", most, int64(burst)+rate.Events(cut+after), bound, st)
	})
}

// An owner that restarts (a crash loop: 10 lives in 20 s) starts the keys
// it owns empty, not full: it cannot tell how much of them its previous
// life spent. Each life handed out a full burst before (5.9 of one bucket
// for a key).
func TestOwnedRestartsNoFreshBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(1), 20
		ask := throttle.PerSecond(10) // each key asked 30 times a second
		c := newOwnedCluster(t, 3, rate, burst, 9)
		keys := c.keysOf("n2", 40)
		admitted := map[string]int64{}
		add := func(m map[string]int64) {
			for k, v := range m {
				admitted[k] += v
			}
		}
		start := time.Now()
		for i := range 10 {
			add(c.load(t, keys, ask, time.Second, uint64(20+i)))
			c.nodes[2].Close() // crashes
			add(c.load(t, keys, ask, 500*time.Millisecond, uint64(40+i), 0, 1))
			c.start(t, 2) // a new life
			time.Sleep(500 * time.Millisecond)
		}
		d := time.Since(start)
		// One bucket, plus the fallback bursts of the other two nodes
		// while the owner is down, as far as they are not charged to it
		// yet.
		one := int64(burst) + rate.Events(d)
		most := checkBound(t, "restarts", admitted, keys, one+2*int64(burst/3+1))
		t.Logf("10 restarts in %v: most admitted for a key %d (%.2f of one bucket, %d); %+v", d, most, float64(most)/float64(one), one, c.stats())
	})
}

// blockTo drops the datagrams a transport sends to one address while set:
// a loss in one direction.
type blockTo struct {
	Transport
	to      string
	blocked atomic.Bool
}

func (b *blockTo) Send(addr string, p []byte) error {
	if b.blocked.Load() && addr == b.to {
		return nil
	}
	return b.Transport.Send(addr, p)
}

// A loss in one direction (n0's datagrams to n1 lost) while the membership
// reports every member alive (a Membership, or Config.Peers): every node
// keeps the same owner for every key (n1's silence rule gave n0's keys a
// second owner), the keys stay within the fault bound, and asks to the
// owner that does not answer fall back at once after the first timeouts
// instead of each waiting for it.
func TestOwnedOneWayLossKeepsOneOwner(t *testing.T) {
	t.Run("membership", func(t *testing.T) { oneWayLoss(t, false) })
	t.Run("peers", func(t *testing.T) { oneWayLoss(t, true) })
}

func oneWayLoss(t *testing.T, peers bool) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(10), 6
		var cut *blockTo
		wrap := func(i int, tr Transport) Transport {
			if i != 0 {
				return tr
			}
			cut = &blockTo{Transport: tr, to: "n1"}
			return cut
		}
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 10, wrap: wrap, peers: peers})
		keys := keyNames(30)
		cut.blocked.Store(true)
		const d = 3 * time.Second
		var slow atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() { // n0's keys asked on n1: n0's answers are lost
			mine := c.keysOf("n0", 30)
			for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
				t0 := time.Now()
				c.lims[1].Allow(context.Background(), mine[i%len(mine)], 1)
				if time.Since(t0) >= DefaultForwardTimeout {
					slow.Add(1)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
		admitted := c.load(t, keys, rate, d, 10)
		wg.Wait()
		for _, k := range keys {
			if o0, o1, o2 := c.lims[0].Owner(k), c.lims[1].Owner(k), c.lims[2].Owner(k); o0 != o1 || o1 != o2 {
				t.Errorf("%s has owners %s, %s and %s", k, o0, o1, o2)
			}
		}
		bound := fallbackBound(rate, burst, 3, d)
		most := checkBound(t, "one-way loss", admitted, keys, bound)
		if s := slow.Load(); s > 2 {
			t.Errorf("%d asks waited the whole timeout for an owner that does not answer, want at most 2", s)
		}
		t.Logf("most admitted for a key %d, bound %d; %d asks waited the timeout; %+v", most, bound, slow.Load(), c.stats())
	})
}

// A node ID, limiter name and key length that make an ask larger than
// MaxPacket are refused when the limiter is made: such asks could never
// be sent, and every decision would fall back.
func TestOwnedRefusesOversizedAsks(t *testing.T) {
	net := newNetwork(sysClock{}, 1)
	long := strings.Repeat("x", maxName)
	newNode := func(opts ...throttle.Option) *Node {
		n, err := NewNode(Config{Transport: net.Endpoint(long), Secret: secret}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	n := newNode()
	if _, err := n.NewOwnedLimiter(long, throttle.PerSecond(1), 1); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("a %d-byte ID and name with %d-byte keys: %v, want ErrInvalid", maxName, maxKeyLen, err)
	}
	short := newNode(throttle.WithMaxKeyLen(MaxPacket - ownedHeaderSize(long, long) - maxAskSize(0) - 2))
	if _, err := short.NewOwnedLimiter(long, throttle.PerSecond(1), 1); err != nil {
		t.Errorf("keys short enough: %v", err)
	}
	n2, err := NewNode(Config{Transport: net.Endpoint("n2"), Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if _, err := n2.NewOwnedLimiter(long, throttle.PerSecond(1), 1); err != nil {
		t.Errorf("a short ID: %v", err)
	}
}

// A node that gets its majority back empties the buckets it kept: while it
// had none, the others may have decided its keys (on their fallback
// buckets; before, with Config.Peers, they took them over), so what its
// stale buckets hold may be spent already. It handed those tokens out
// again before.
func TestOwnedQuorumBackEmptiesStaleBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(5), 20
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 11, peers: true})
		key := c.keysOf("n0", 30)[0]
		ctx := context.Background()
		for range burst {
			c.lims[0].Allow(ctx, key, 1)
		}
		c.net.Partition([]string{"n0"}, []string{"n1", "n2"})
		for range 40 { // 2 s: the others take key over and spend it
			c.lims[1].Allow(ctx, key, 1)
			time.Sleep(50 * time.Millisecond)
		}
		if c.nodes[0].own.quorum.Load() {
			t.Fatal("n0 alone still has a quorum")
		}
		c.net.Heal()
		for !c.nodes[0].own.quorum.Load() {
			time.Sleep(time.Millisecond)
		}
		back := time.Now()
		time.Sleep(ownedInterval)
		admitted := int64(0)
		for range 30 {
			if d, _ := c.lims[0].Allow(ctx, key, 1); d.Allowed {
				admitted++
			}
		}
		if most := rate.Events(time.Since(back)) + 1; admitted > most {
			t.Errorf("n0 admitted %d of %s right after its quorum came back, at most %d refilled since", admitted, key, most)
		}
		t.Logf("n0 admitted %d right after its quorum came back; %+v", admitted, c.stats())
	})
}

// An owner that loses its majority decides its own keys on its own bucket
// read at the fallback rate, not on a fresh fallback bucket: what it
// admits of a key before and while apart stays within one bucket. A
// fallback bucket of its own added burst/N to the partition bound.
func TestOwnedOwnerApartKeepsItsBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(1), 21
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 12})
		key := c.keysOf("n0", 30)[0]
		ctx := context.Background()
		start, admitted := time.Now(), int64(0)
		ask := func() {
			if d, _ := c.lims[0].Allow(ctx, key, 1); d.Allowed {
				admitted++
			}
		}
		for range 2 * burst {
			ask()
		}
		c.net.Partition([]string{"n0"}, []string{"n1"}, []string{"n2"})
		for range 150 { // 1.5 s: n0 loses its majority after 4 intervals
			ask()
			time.Sleep(10 * time.Millisecond)
		}
		if c.nodes[0].own.quorum.Load() {
			t.Fatal("n0 alone still has a quorum")
		}
		if most := int64(burst) + rate.Events(time.Since(start)); admitted > most {
			t.Errorf("n0 admitted %d of its key across losing its majority, one bucket admits %d", admitted, most)
		}
		t.Logf("n0 admitted %d of its key; %+v", admitted, c.lims[0].Stats())
	})
}

// A restarted owner that first hears a peer which restarted with it (within
// an interval) cannot take that for a cluster's first start: the peer that
// ran all along may not have been heard yet, or only in datagrams dropped
// as addressed to the owner's previous life. It must start its keys empty
// until every peer was heard. It handed out a full burst of a key its
// previous life had spent before (the simulator's seed
// 13149255347128470171: 11 of a key where the restart bound is 10.0).
func TestOwnedRestartHearsRestartedPeerFirst(t *testing.T) {
	// n2, which ran all along, is cut off from n0 and n1 for a moment
	t.Run("cut", func(t *testing.T) { restartWithPeer(t, false) })
	// n0's datagrams to n2 are lost: n2 goes on addressing n0's previous
	// life, and n0 drops what it hears from n2
	t.Run("one-way", func(t *testing.T) { restartWithPeer(t, true) })
}

func restartWithPeer(t *testing.T, oneWay bool) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(5), 20
		var block *blockTo
		lives := 0
		wrap := func(i int, tr Transport) Transport {
			if i != 0 {
				return tr
			}
			lives++
			block = &blockTo{Transport: tr, to: "n2"}
			block.blocked.Store(oneWay && lives == 2) // n2 knows n0's first life
			return block
		}
		c := newOwnedClusterOf(t, ownedSpec{n: 3, rate: rate, burst: burst, seed: 13, peers: true, wrap: wrap})
		key := c.keysOf("n0", 30)[0]
		ctx := context.Background()
		for range burst {
			c.lims[0].Allow(ctx, key, 1)
		}
		// n1 and n0 crash and restart 50 ms apart.
		c.nodes[1].Close()
		c.nodes[0].Close()
		if !oneWay {
			c.net.Partition([]string{"n0", "n1"}, []string{"n2"})
		}
		c.start(t, 1)
		time.Sleep(ownedInterval / 2)
		c.start(t, 0)
		restart := time.Now()
		time.Sleep(2 * ownedInterval) // n0 hears n1, and not n2 in its life
		admitted := int64(0)
		for range burst {
			if d, _ := c.lims[0].Allow(ctx, key, 1); d.Allowed {
				admitted++
			}
		}
		if most := rate.Events(time.Since(restart)) + 1; admitted > most {
			t.Errorf("restarted n0 admitted %d of its spent key %v after its restart, at most %d refilled since", admitted, time.Since(restart), most)
		}
		c.net.Heal()
		block.blocked.Store(false)
		time.Sleep(2 * ownedInterval)
		if st := c.nodes[0].own.start.Load(); st != startLate {
			t.Errorf("n0 hearing n2 again takes its start for %d, want a restart (%d)", st, startLate)
		}
	})
}

// An owner that has no limiter of an ask's name (a reload that changes a
// limit reaches the nodes one after the other: the new limiter has a new
// name) answers at once that it cannot decide, and the asker falls back
// at once. The ask waited the whole forward timeout before, as for a
// dead owner.
func TestOwnedUnknownLimiterAnsweredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newOwnedClusterOf(t, ownedSpec{n: 2, rate: throttle.PerSecond(1), burst: 4, seed: 14})
		reloaded, err := c.nodes[1].NewOwnedLimiter("api|2/s|8", throttle.PerSecond(2), 8)
		if err != nil {
			t.Fatal(err)
		}
		key := c.keysOf("n0", 30)[0]
		for i := range 2 {
			start := time.Now()
			d, err := reloaded.Allow(context.Background(), key, 1)
			if waited := time.Since(start); err != nil || !d.Allowed || waited >= DefaultForwardTimeout {
				t.Fatalf("ask %d to an owner without the limiter: %+v, %v after %v; want a fallback decision within the round trip", i, d, err, waited)
			}
		}
		if st := reloaded.Stats(); st.Fallback != 2 || st.Answered != 0 {
			t.Errorf("stats %+v, want 2 fallbacks", st)
		}
	})
}
