package gossip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gossipnet"
	"github.com/throttlekit/throttle/throttletest"
)

// sysClock reads time.Now: in a synctest bubble, the bubble's fake time,
// which the forward timeouts and batch delays run on too.
type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

// ownedCluster is a cluster of nodes with one owned limiter each, on an
// in-memory network delivered by a goroutine, for synctest bubbles.
type ownedCluster struct {
	net   *gossipnet.Network
	addrs []string
	nodes []*Node
	lims  []*OwnedLimiter
	ms    []*StaticMembership
	spec  ownedSpec
}

// ownedSpec is how newOwnedClusterOf builds a cluster.
type ownedSpec struct {
	n     int
	rate  throttle.Rate
	burst int
	seed  uint64
	opts  []throttle.Option
	// peers: Config.Peers instead of a Membership, so that the node's
	// silence rule is its failure detector.
	peers bool
	// wrap, if set, returns node i's transport made from its endpoint.
	wrap func(i int, tr Transport) Transport
}

const ownedInterval = 100 * time.Millisecond

// ownedNode returns a node of cfg, closed when tb ends, with an owned
// limiter "api" of rate and burst (and oc, if given).
func ownedNode(tb testing.TB, cfg Config, rate throttle.Rate, burst int, oc []OwnedConfig, opts ...throttle.Option) (*Node, *OwnedLimiter) {
	tb.Helper()
	n, err := NewNode(cfg, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.Close() })
	l, err := n.NewOwnedLimiter("api", rate, burst, oc...)
	if err != nil {
		tb.Fatal(err)
	}
	return n, l
}

func newOwnedCluster(t *testing.T, n int, rate throttle.Rate, burst int, seed uint64, opts ...throttle.Option) *ownedCluster {
	return newOwnedClusterOf(t, ownedSpec{n: n, rate: rate, burst: burst, seed: seed, opts: opts})
}

func newOwnedClusterOf(t *testing.T, spec ownedSpec) *ownedCluster {
	t.Helper()
	c := &ownedCluster{net: newNetwork(sysClock{}, spec.seed), spec: spec}
	c.net.SetDelay(100*time.Microsecond, 0)
	for i := range spec.n {
		c.addrs = append(c.addrs, fmt.Sprintf("n%d", i))
	}
	c.nodes, c.lims, c.ms = make([]*Node, spec.n), make([]*OwnedLimiter, spec.n), make([]*StaticMembership, spec.n)
	for i := range spec.n {
		c.start(t, i)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.net.Deliver()
			time.Sleep(50 * time.Microsecond)
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		for _, n := range c.nodes {
			n.Close()
		}
	})
	time.Sleep(3 * ownedInterval) // hellos: the nodes learn each other's incarnations
	return c
}

// start starts node i (again, if it ran: a new life, its state lost).
func (c *ownedCluster) start(t *testing.T, i int) {
	var tr Transport = c.net.Endpoint(c.addrs[i])
	if c.spec.wrap != nil {
		tr = c.spec.wrap(i, tr)
	}
	cfg := Config{Transport: tr, Secret: secret, Interval: ownedInterval}
	if c.spec.peers {
		cfg.ID, cfg.Peers = c.addrs[i], c.addrs
	} else {
		c.ms[i] = NewStaticMembership(Member{ID: c.addrs[i]}, c.addrs...)
		cfg.Membership = c.ms[i]
	}
	node, l := ownedNode(t, cfg, c.spec.rate, c.spec.burst, nil, append([]throttle.Option{throttle.WithClock(sysClock{})}, c.spec.opts...)...)
	node.Start()
	c.nodes[i], c.lims[i] = node, l
}

func (c *ownedCluster) stats() (s OwnedStats) {
	for _, l := range c.lims {
		s = s.Plus(l.Stats())
	}
	return s
}

// load asks keys at 3x rate each for d, from clients on every node (and
// only on the nodes in from, if given), at random, and returns what was
// admitted per key.
func (c *ownedCluster) load(t *testing.T, keys []string, rate throttle.Rate, d time.Duration, seed uint64, from ...int) map[string]int64 {
	t.Helper()
	if len(from) == 0 {
		for i := range c.lims {
			from = append(from, i)
		}
	}
	const clients = 4 // per node
	perClient := 3 * float64(rate.Count()) / rate.Period().Seconds() * float64(len(keys)) / float64(clients*len(from))
	gap := time.Duration(float64(time.Second) / perClient)
	var mu sync.Mutex
	admitted := map[string]int64{}
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for _, i := range from {
		for k := range clients {
			rng := rand.New(rand.NewPCG(seed, uint64(i*clients+k)))
			wg.Go(func() {
				for time.Now().Before(end) {
					key := keys[rng.IntN(len(keys))]
					dec, err := c.lims[i].Allow(context.Background(), key, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if dec.Allowed {
						mu.Lock()
						admitted[key]++
						mu.Unlock()
					}
					time.Sleep(time.Duration(rng.Int64N(int64(2 * gap))))
				}
			})
		}
	}
	wg.Wait()
	return admitted
}

// keysOf returns the keys of keyNames(n) that owner owns.
func (c *ownedCluster) keysOf(owner string, n int) []string {
	var keys []string
	for _, k := range keyNames(n) {
		if c.lims[0].Owner(k) == owner {
			keys = append(keys, k)
		}
	}
	return keys
}

func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	return keys
}

// Three nodes under random load admit what one bucket per key admits:
// never more than burst + rate x time, and within 5 % of it (the load is
// 3x the rate), with no fallback.
func TestOwnedExactAcrossNodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(10), 5
		c := newOwnedCluster(t, 3, rate, burst, 1)
		keys := keyNames(30)
		const d = 10 * time.Second
		admitted := c.load(t, keys, rate, d, 1)
		one := int64(burst) + rate.Events(d)
		var total int64
		for _, k := range keys {
			if admitted[k] > one {
				t.Errorf("%s: %d admitted, one bucket admits at most %d", k, admitted[k], one)
			}
			total += admitted[k]
		}
		st := c.stats()
		if float64(total) < 0.95*float64(one*int64(len(keys))) {
			t.Errorf("%d admitted over %d keys, one bucket each admits %d", total, len(keys), one*int64(len(keys)))
		}
		if st.Fallback != 0 || st.Forwarded == 0 || st.Answered != st.Forwarded || st.Served != st.Forwarded {
			t.Errorf("stats %+v", st)
		}
		if st.Batches >= st.Forwarded {
			t.Errorf("%d datagrams for %d forwarded asks: not batched", st.Batches, st.Forwarded)
		}
		t.Logf("%d admitted of at most %d; %+v", total, one*int64(len(keys)), st)
	})
}

// fallbackBound is what the cluster may admit for a key over d while
// asks fall back on every node but the owner: the owner's bucket plus
// each other node's fallback bucket (rate and burst / N).
func fallbackBound(rate throttle.Rate, burst, nodes int, d time.Duration) int64 {
	one := int64(burst) + rate.Events(d)
	fb := int64(max(1, burst/nodes)) + rate.Events(d)/int64(nodes) + 1
	return one + int64(nodes-1)*fb
}

// Lost, duplicated, delayed and reordered asks and answers: duplicates
// are never served twice, and what lost or late answers let the fallback
// buckets admit stays within the stated bound.
func TestOwnedFaults(t *testing.T) {
	for _, tc := range []struct {
		name          string
		loss, dup     float64
		delay, jitter time.Duration
	}{
		{"lost+duplicated+reordered", 0.2, 0.3, 200 * time.Microsecond, 2 * time.Millisecond},
		{"late", 0, 0, 20 * time.Millisecond, 20 * time.Millisecond}, // round trips of 40 to 80 ms, timeout 50
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rate, burst := throttle.PerSecond(10), 6
				c := newOwnedCluster(t, 3, rate, burst, 2)
				c.net.SetLoss(tc.loss)
				c.net.SetDuplicate(tc.dup)
				c.net.SetDelay(tc.delay, tc.jitter)
				keys := keyNames(20)
				const d = 10 * time.Second
				admitted := c.load(t, keys, rate, d, 2)
				bound := fallbackBound(rate, burst, 3, d)
				for _, k := range keys {
					if admitted[k] > bound {
						t.Errorf("%s: %d admitted, bound %d", k, admitted[k], bound)
					}
				}
				st := c.stats()
				var dup uint64
				for _, n := range c.nodes {
					dup += n.Stats().Duplicate
				}
				switch {
				case st.Served > st.Forwarded || st.Fallback == 0:
					t.Errorf("served %d of %d forwarded; %+v", st.Served, st.Forwarded, st)
				case tc.dup > 0 && dup == 0:
					t.Errorf("no duplicate dropped")
				case tc.loss == 0 && st.Late == 0:
					t.Errorf("no late answer counted: %+v", st)
				}
				t.Logf("%+v; %d duplicate datagrams dropped; bound per key %d", st, dup, bound)
			})
		})
	}
}

// The asks of one AllowMany for one owner leave in as few datagrams as
// fit them.
func TestOwnedAllowManyBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newOwnedCluster(t, 2, throttle.PerSecond(10), 5, 5)
		var asks []Ask
		for _, k := range c.keysOf("n1", 400) {
			asks = append(asks, Ask{Key: k, N: 1})
		}
		c.lims[0].AllowMany(context.Background(), asks)
		for _, a := range asks {
			if a.Err != nil || !a.Decision.Allowed {
				t.Fatalf("%s: %+v", a.Key, a)
			}
		}
		st := c.lims[0].Stats()
		per := (MaxPacket - ownedHeaderSize("n0", "api")) / (askEntry{id: 1 << 14, key: "key-100", n: 1}).size()
		if want := uint64((len(asks) + per - 1) / per); st.Forwarded != uint64(len(asks)) || st.Batches != want {
			t.Errorf("%d asks forwarded in %d datagrams, want %d in %d", st.Forwarded, st.Batches, len(asks), want)
		}
	})
}

// Under load, the asks for one owner leave at most once per Delay, so
// that the datagrams (and the owner's answers) do not grow with the asks;
// a lone ask, after a quiet Delay, still leaves at once.
func TestOwnedDelayPacesDatagrams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newOwnedCluster(t, 2, throttle.PerSecond(1_000_000), 1000, 7)
		keys := c.keysOf("n1", 100)
		const load, callers = 200 * time.Millisecond, 8
		st0 := c.lims[0].Stats()
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				for j, end := i, time.Now().Add(load); time.Now().Before(end); j++ {
					if _, err := c.lims[0].Allow(context.Background(), keys[j%len(keys)], 1); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(200 * time.Microsecond)
				}
			})
		}
		wg.Wait()
		st := c.lims[0].Stats()
		sent, asked := st.Batches-st0.Batches, st.Forwarded-st0.Forwarded
		t.Logf("%d asks in %d datagrams over %v", asked, sent, load)
		if most := uint64(load/DefaultForwardDelay) + 2; sent > most || st.Fallback > 0 {
			t.Errorf("%d asks in %d datagrams over %v (%d fallbacks), want at most %d datagrams: one per %v",
				asked, sent, load, st.Fallback, most, DefaultForwardDelay)
		}
		time.Sleep(2 * DefaultForwardDelay)
		start := time.Now()
		c.lims[0].Allow(context.Background(), keys[0], 1)
		if took := time.Since(start); took >= DefaultForwardDelay {
			t.Errorf("a lone ask took %v, want a round trip (below %v)", took, DefaultForwardDelay)
		}
	})
}

// A dead owner's keys fall back until the membership declares it dead,
// then move at once to the live members; the others' keys stay put.
func TestOwnedOwnerKilled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rate, burst := throttle.PerSecond(10), 6
		c := newOwnedCluster(t, 3, rate, burst, 3)
		var theirs, others []string
		for _, k := range keyNames(40) {
			if c.lims[0].Owner(k) == "n2" {
				theirs = append(theirs, k)
			} else {
				others = append(others, k)
			}
		}
		before := map[string]string{}
		for _, k := range others {
			before[k] = c.lims[0].Owner(k)
		}
		c.net.Partition([]string{"n2"})
		c.nodes[2].Close()
		// Shorter than the silence after which the nodes take n2 for dead
		// themselves (Resend+3 intervals): until then only the membership
		// can tell.
		d := 3 * ownedInterval
		admitted := c.load(t, theirs, rate, d, 3, 0, 1)
		st := c.stats()
		if st.Fallback == 0 {
			t.Fatalf("no fallback while the owner is dead: %+v", st)
		}
		for _, k := range theirs {
			// Only the fallback buckets of n0 and n1 decide.
			if b := 2 * (int64(max(1, burst/3)) + rate.Events(d)/3 + 1); admitted[k] > b {
				t.Errorf("%s: %d admitted while its owner is dead, bound %d", k, admitted[k], b)
			}
		}
		for i := range 2 {
			c.ms[i].update(MemberEvent{Kind: MemberDead, Member: Member{ID: "n2"}})
		}
		for _, k := range theirs {
			if o0, o1 := c.lims[0].Owner(k), c.lims[1].Owner(k); o0 == "n2" || o0 != o1 {
				t.Fatalf("%s owned by %s and %s after n2 died", k, o0, o1)
			}
		}
		for _, k := range others {
			if o := c.lims[0].Owner(k); o != before[k] {
				t.Errorf("%s moved from %s to %s: not a key of the dead member", k, before[k], o)
			}
		}
		fb := c.stats().Fallback
		d = 2 * time.Second
		admitted = c.load(t, theirs, rate, d, 4, 0, 1)
		if got := c.stats().Fallback; got != fb {
			t.Errorf("%d more fallbacks after the keys moved", got-fb)
		}
		for _, k := range theirs {
			if one := int64(burst) + rate.Events(d); admitted[k] > one {
				t.Errorf("%s: %d admitted on its new owner, one bucket admits %d", k, admitted[k], one)
			}
		}
	})
}

// ownedPair is two nodes on manual time that know each other, with an
// owned limiter each, for datagrams injected by hand.
func ownedPair(t *testing.T, opts ...throttle.Option) (*gossipnet.Network, []*Node, []*OwnedLimiter) {
	clk := throttletest.NewClock()
	net := newNetwork(clk, 1)
	var nodes []*Node
	var lims []*OwnedLimiter
	for _, a := range []string{"n0", "n1"} {
		n, l := ownedNode(t, Config{Transport: net.Endpoint(a), Secret: secret, Peers: []string{"n0", "n1"}},
			throttle.PerSecond(1), 3, nil, append([]throttle.Option{throttle.WithClock(clk)}, opts...)...)
		nodes, lims = append(nodes, n), append(lims, l)
	}
	for range 2 {
		clk.Advance(time.Second)
		for _, n := range nodes {
			n.Tick()
		}
		net.Deliver()
	}
	return net, nodes, lims
}

// askBodies returns the unsealed bodies of an ask datagram from n.
func askBodies(n *Node, table string, asks ...askEntry) [][]byte {
	e := &encoder{hdr: header{typ: msgAsk, sender: n.id, table: table, incarnation: n.incarnation.Load(), round: 1, start: n.created}}
	for _, a := range asks {
		e.addAsk(a)
	}
	return e.finish()
}

// Forged, replayed, oversized, malformed and stale asks are refused and
// counted, and charge nothing; answers that match no ask are counted.
func TestOwnedRefusesBadAsks(t *testing.T) {
	_, nodes, lims := ownedPair(t)
	owner := lims[1]
	ask := nodes[0].sealFor("n1", askBodies(nodes[0], "api", askEntry{id: 1, key: "victim", n: 1}))[0]
	inject(nodes[1], "n0", ask)
	if s, tok := owner.Stats().Served, owner.exact.Tokens("victim"); s != 1 || tok != 2 {
		t.Fatalf("a valid ask: served %d, %d tokens left", s, tok)
	}
	before := nodes[1].Stats()
	inject(nodes[1], "n0", ask) // replayed (or a network duplicate)
	forged := append([]byte(nil), ask...)
	forged[len(forged)-40] ^= 1
	inject(nodes[1], "n0", forged)
	inject(nodes[1], "n0", make([]byte, MaxPacket+1))
	zero := nodes[0].sealFor("n1", askBodies(nodes[0], "api", askEntry{id: 2, key: "victim", n: 0}))[0]
	inject(nodes[1], "n0", zero)
	// Addressed to no incarnation of the owner (as if captured before it
	// restarted, or forged without knowing it).
	nodes[0].mu.Lock()
	pr := nodes[0].peers["n1"]
	pr.seq++
	stale := nodes[0].sendSig.seal(askBodies(nodes[0], "api", askEntry{id: 3, key: "victim", n: 1})[0], "n1", header{parts: 1, seq: pr.seq})
	nodes[0].mu.Unlock()
	inject(nodes[1], "n0", stale)
	after := nodes[1].Stats()
	if after.Duplicate != before.Duplicate+1 || after.BadMAC != before.BadMAC+1 || after.Malformed != before.Malformed+2 || after.Stale != before.Stale+1 {
		t.Errorf("stats before %+v, after %+v", before, after)
	}
	if s, tok := owner.Stats().Served, owner.exact.Tokens("victim"); s != 1 || tok != 2 {
		t.Errorf("after the bad asks: served %d, %d tokens left, want 1 and 2", s, tok)
	}
	e := &encoder{hdr: header{typ: msgAnswer, sender: "n0", table: "api", incarnation: nodes[0].incarnation.Load(), round: 1, start: nodes[0].created}}
	e.addAnswer(answerEntry{id: 99, verdict: verdictOK})
	for _, p := range nodes[0].sealFor("n1", e.finish()) {
		inject(nodes[1], "n0", p)
	}
	if l := owner.Stats().Late; l != 1 {
		t.Errorf("an answer to no ask: Late %d, want 1", l)
	}
}

// A peer flooding asks for ever new keys makes the owner hold no state
// per ask, and no more buckets than WithMaxKeys.
func TestOwnedFloodBounded(t *testing.T) {
	const maxKeys = 1000
	net, nodes, lims := ownedPair(t, throttle.WithMaxKeys(maxKeys))
	asked := 0
	for i := range 500 {
		var asks []askEntry
		for j := range 60 {
			asks = append(asks, askEntry{id: uint64(j + 1), key: fmt.Sprintf("flood-%d-%d", i, j), n: 1})
		}
		for _, p := range nodes[0].sealFor("n1", askBodies(nodes[0], "api", asks...)) {
			inject(nodes[1], "n0", p)
		}
		asked += len(asks)
		net.Deliver() // the answers
	}
	o := lims[1]
	if s := o.Stats().Served; s != uint64(asked) {
		t.Errorf("served %d of %d asks", s, asked)
	}
	if k := o.exact.Map().Len(); k > maxKeys {
		t.Errorf("the owner holds %d buckets, WithMaxKeys %d", k, maxKeys)
	}
	o.mu.Lock()
	held := len(o.calls) + len(o.out)
	o.mu.Unlock()
	if held != 0 {
		t.Errorf("the owner holds %d asks", held)
	}
	if l := lims[0].Stats().Late; l != uint64(asked) {
		t.Errorf("the flooder got %d answers to asks it did not send, want %d", l, asked)
	}
}

// The owned limiter of a standalone node is a token bucket.
func TestOwnedConformance(t *testing.T) {
	throttletest.Run(t, throttletest.Suite{
		New: func(t testing.TB, clk *throttletest.Clock) throttle.Limiter {
			_, l := ownedNode(t, Config{}, throttle.PerSecond(10), 5, nil, throttle.WithClock(clk))
			return l
		},
		Limit: 5,
		Bound: func(d time.Duration) int64 { return 5 + throttle.PerSecond(10).Events(d) },
	})
}

// Rendezvous hashing: a member leaving moves only its keys, spread over
// the others; the owners are balanced.
func TestOwnerOfMovesOnlyTheMembersKeys(t *testing.T) {
	all := []string{"a", "b", "c", "d"}
	count := map[string]int{}
	for _, k := range keyNames(20000) {
		o := ownerOf(k, all)
		count[o]++
		if o2 := ownerOf(k, []string{"a", "b", "d"}); o != "c" && o2 != o {
			t.Fatalf("%s moved from %s to %s when c left", k, o, o2)
		}
	}
	for _, m := range all {
		if c := count[m]; c < 4500 || c > 5500 {
			t.Errorf("member %s owns %d of 20000 keys", m, c)
		}
	}
}

// Concurrent AllowMany calls to an owner not heard from yet: each
// datagram fails to leave, so its asks fall back at once, also while
// another caller's asks are still being enqueued. A caller whose first
// asks completed before its last was enqueued closed its waiter twice
// (a panic that killed the daemons of the scale test).
func TestOwnedAllowManyWhileAsksFail(t *testing.T) {
	net := newNetwork(throttletest.NewClock(), 1)
	var lims []*OwnedLimiter
	for _, a := range []string{"n0", "n1"} {
		_, l := ownedNode(t, Config{Transport: net.Endpoint(a), Secret: secret, Peers: []string{"n0", "n1"}},
			throttle.PerSecond(1000), 10, []OwnedConfig{{Delay: time.Microsecond}})
		lims = append(lims, l)
	}
	var keys []string
	for _, k := range keyNames(2000) {
		if lims[0].Owner(k) == "n1" {
			keys = append(keys, k)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for r := range 100 {
				asks := make([]Ask, 0, 200)
				for i := range 200 {
					asks = append(asks, Ask{Key: keys[(g*7919+r*200+i)%len(keys)], N: 1})
				}
				lims[0].AllowMany(context.Background(), asks)
				for _, a := range asks {
					if a.Err != nil {
						t.Error(a.Err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if st := lims[0].Stats(); st.Fallback != 8*100*200 || st.Forwarded != 0 {
		t.Errorf("%+v", st)
	}
}

func TestOwnedLimiterErrors(t *testing.T) {
	n, err := NewNode(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.NewOwnedLimiter("api", throttle.PerSecond(1), 1); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"duplicate":  func() error { _, err := n.NewOwnedLimiter("api", throttle.PerSecond(1), 1); return err },
		"no name":    func() error { _, err := n.NewOwnedLimiter("", throttle.PerSecond(1), 1); return err },
		"zero burst": func() error { _, err := n.NewOwnedLimiter("b", throttle.PerSecond(1), 0); return err },
		"zero rate":  func() error { _, err := n.NewOwnedLimiter("c", throttle.Rate{}, 1); return err },
		"two configs": func() error {
			_, err := n.NewOwnedLimiter("d", throttle.PerSecond(1), 1, OwnedConfig{}, OwnedConfig{})
			return err
		},
		"negative": func() error {
			_, err := n.NewOwnedLimiter("e", throttle.PerSecond(1), 1, OwnedConfig{Timeout: -1})
			return err
		},
	} {
		if err := f(); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	n.Close()
	if _, err := n.NewOwnedLimiter("f", throttle.PerSecond(1), 1); !errors.Is(err, throttle.ErrClosed) {
		t.Errorf("closed node: %v", err)
	}
}
