package gossip

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
)

// BenchmarkOwnedForward measures a decision forwarded to its owner over
// loopback UDP, one at a time: its latency (p50 and p99, µs) is a round
// trip plus the work of both nodes.
//
//	go test -run '^$' -bench OwnedForward -benchtime 20000x ./distributed/gossip/
func BenchmarkOwnedForward(b *testing.B) {
	var nodes []*Node
	var lims []*OwnedLimiter
	var trs []*UDPTransport
	for range 2 {
		tr, err := ListenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		trs = append(trs, tr)
	}
	for i, tr := range trs {
		n, l := ownedNode(b, Config{Transport: tr, Secret: secret, Peers: []string{trs[1-i].Addr()}, Interval: 10 * time.Millisecond},
			throttle.PerSecond(1_000_000_000), 1_000_000, nil)
		n.Start()
		nodes, lims = append(nodes, n), append(lims, l)
	}
	for deadline := time.Now().Add(5 * time.Second); nodes[0].Stats().PacketsReceived == 0 || nodes[1].Stats().PacketsReceived == 0; {
		if time.Now().After(deadline) {
			b.Fatal("the nodes do not hear each other")
		}
		time.Sleep(time.Millisecond)
	}
	var keys []string
	for i := 0; len(keys) < 1000; i++ {
		if k := fmt.Sprintf("key-%d", i); lims[0].Owner(k) == nodes[1].ID() {
			keys = append(keys, k)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if _, err := lims[0].Allow(context.Background(), keys[i%len(keys)], 1); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	if st := lims[0].Stats(); st.Fallback > 0 {
		b.ReportMetric(float64(st.Fallback), "fallbacks")
	}
}

// BenchmarkOwnedLocal measures a decision on a key the node owns (a
// standalone node owns every key): the owner look-up and the bucket.
func BenchmarkOwnedLocal(b *testing.B) {
	_, l := ownedNode(b, Config{}, throttle.PerSecond(1_000_000_000), 1_000_000, nil)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.Allow(ctx, keys[i%len(keys)], 1)
	}
}
