package gossip_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/gossip"
)

const interval = 20 * time.Millisecond

// pair makes two nodes that know each other over tr (loopback UDP, or
// sealed) and runs their first rounds: until a node has heard its peers
// start with it, it cannot tell a cluster's first start from its own
// restart, and decides conservatively. Start would run a round every
// Interval; these examples run them with tick.
func pair(ta, tb gossip.Transport, secret []byte) (a, b *gossip.Node) {
	a, _ = gossip.NewNode(gossip.Config{Transport: ta, Secret: secret, Peers: []string{tb.Addr()}, Interval: interval})
	b, _ = gossip.NewNode(gossip.Config{Transport: tb, Secret: secret, Peers: []string{ta.Addr()}, Interval: interval})
	tick(a, b)
	waitFor(func() bool { return a.Stats().PacketsReceived > 0 && b.Stats().PacketsReceived > 0 })
	return a, b
}

func udpPair() (a, b *gossip.Node) {
	ta, _ := gossip.ListenUDP("127.0.0.1:0")
	tb, _ := gossip.ListenUDP("127.0.0.1:0")
	return pair(ta, tb, []byte("a shared secret, 16+ bytes long"))
}

// tick runs a round of each node, past the next round boundary.
func tick(nodes ...*gossip.Node) {
	time.Sleep(interval)
	for _, n := range nodes {
		n.Tick()
	}
}

// waitFor polls cond for up to 10 s: the datagrams of a round are on
// their way.
func waitFor(cond func() bool) {
	for end := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

func ExampleNode() {
	a, b := udpPair()
	defer a.Close()
	defer b.Close()
	la, _ := a.NewLimiter("api", throttle.NewRate(60, time.Hour), 10)
	lb, _ := b.NewLimiter("api", throttle.NewRate(60, time.Hour), 10)

	for range 8 {
		la.Allow(context.Background(), "alice", 1) // 8 requests land on node a
	}
	fmt.Println("a holds", la.Tokens("alice"), "and b", lb.Tokens("alice"))
	tick(a) // a reports its hits
	waitFor(func() bool { return lb.Tokens("alice") < 10 })
	fmt.Println("after a round, b holds", lb.Tokens("alice"))
	// Output:
	// a holds 2 and b 10
	// after a round, b holds 2
}

func ExampleNode_NewOwnedLimiter() {
	a, b := udpPair()
	defer a.Close()
	defer b.Close()
	cfg := gossip.OwnedConfig{Timeout: time.Second} // generous on a loaded host
	la, _ := a.NewOwnedLimiter("api", throttle.NewRate(60, time.Hour), 2, cfg)
	lb, _ := b.NewOwnedLimiter("api", throttle.NewRate(60, time.Hour), 2, cfg)

	fmt.Println("one owner:", la.Owner("alice") == lb.Owner("alice"))
	for _, l := range []*gossip.OwnedLimiter{lb, la, lb} {
		d, _ := l.Allow(context.Background(), "alice", 1) // one bucket, on alice's owner
		fmt.Println(d.Allowed, d.Remaining)
	}
	st := la.Stats().Plus(lb.Stats())
	fmt.Printf("decided on the owner's bucket: %d of 3\n", st.Local+st.Answered)
	// Output:
	// one owner: true
	// true 1
	// true 0
	// false 0
	// decided on the owner's bucket: 3 of 3
}

// A cluster on a membership: a reloaded static list here; a failure
// detector's (gossipmember, on memberlist) reports dead members too.
func ExampleStaticMembership() {
	tr, _ := gossip.ListenUDP("127.0.0.1:0")
	members := gossip.NewStaticMembership(gossip.Member{}, "10.0.0.2:7946")
	a, _ := gossip.NewNode(gossip.Config{Transport: tr, Secret: []byte("a shared secret, 16+ bytes long"), Membership: members})
	defer a.Close()
	fmt.Println(a.Peers())
	members.Set("10.0.0.2:7946", "10.0.0.3:7946") // the list reloaded: 10.0.0.3 joins
	fmt.Println(a.Peers())
	members.Set("10.0.0.3:7946") // 10.0.0.2 removed from the list: it leaves
	fmt.Println(a.Peers())
	// Output:
	// [10.0.0.2:7946]
	// [10.0.0.2:7946 10.0.0.3:7946]
	// [10.0.0.3:7946]
}

// keyring is a gossip.Keyring whose keys the program sets; a
// *memberlist.Keyring fits too.
type keyring struct {
	mu   sync.Mutex
	keys [][]byte
}

func (r *keyring) GetPrimaryKey() []byte { r.mu.Lock(); defer r.mu.Unlock(); return r.keys[0] }
func (r *keyring) GetKeys() [][]byte     { r.mu.Lock(); defer r.mu.Unlock(); return r.keys }
func (r *keyring) set(keys ...[]byte)    { r.mu.Lock(); r.keys = keys; r.mu.Unlock() }

// Datagrams sealed with AES-GCM under a keyring, rotated without a
// restart; no Secret is needed.
func ExampleSeal() {
	key1, key2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)
	ring := &keyring{keys: [][]byte{key1}} // the same keys on every node
	ua, _ := gossip.ListenUDP("127.0.0.1:0")
	ub, _ := gossip.ListenUDP("127.0.0.1:0")
	ta, _ := gossip.Seal(ua, ring)
	tb, _ := gossip.Seal(ub, ring)
	a, b := pair(ta, tb, nil)
	defer a.Close()
	defer b.Close()
	la, _ := a.NewLimiter("api", throttle.NewRate(60, time.Hour), 10)
	lb, _ := b.NewLimiter("api", throttle.NewRate(60, time.Hour), 10)
	la.Allow(context.Background(), "alice", 8)
	ring.set(key1, key2) // rotation: add the new key everywhere...
	ring.set(key2, key1) // ...make it primary everywhere...
	ring.set(key2)       // ...remove the old one
	tick(a)
	waitFor(func() bool { return lb.Tokens("alice") < 10 })
	fmt.Println("b holds", lb.Tokens("alice"), "refused", tb.Refused())
	// Output: b holds 2 refused 0
}
