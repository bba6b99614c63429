package gossip

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
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
	nodes, lims := udpOwnedCluster(b, 2, nil)
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
	reportLatency(b, lat)
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

// udpOwnedCluster starts n nodes gossiping over loopback UDP, each with
// an owned limiter of a rate and burst no test reaches, and waits until
// each has heard from every peer.
func udpOwnedCluster(b *testing.B, n int, oc []OwnedConfig) ([]*Node, []*OwnedLimiter) {
	var nodes []*Node
	var lims []*OwnedLimiter
	var trs []Transport
	for range n {
		tr, err := ListenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		trs = append(trs, tr)
	}
	for i, tr := range trs {
		var peers []string
		for j, p := range trs {
			if j != i {
				peers = append(peers, p.Addr())
			}
		}
		n, l := ownedNode(b, Config{Transport: tr, Secret: secret, Peers: peers, Interval: 10 * time.Millisecond},
			throttle.PerSecond(1_000_000_000), 1_000_000, oc)
		n.Start()
		nodes, lims = append(nodes, n), append(lims, l)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		heard := true
		for _, l := range lims {
			fb := l.Stats().Fallback
			for i := range 30 {
				l.Allow(context.Background(), fmt.Sprintf("probe-%d", i), 1)
			}
			heard = heard && l.Stats().Fallback == fb
		}
		if heard {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the nodes do not hear each other")
		}
	}
	return nodes, lims
}

// BenchmarkOwnedClusterCPU measures the CPU time (user and system, of
// the whole process) per decision of a 3-node loopback UDP cluster under
// a steady load like the daemon's at 1,000,000 keys: 16,000 asks a
// second into each node, from 2 callers per node that each, like a
// connection's reader, ask at once (in one AllowMany) the asks due since
// their last call, and sleep 1 ms when none are. Keys are spread over
// 100,000, so two thirds are forwarded. cpu-ns/op is the figure; ns/op
// is set by the load's rate; p50-µs and p99-µs are the waits of the
// AllowMany calls.
//
//	go test -run '^$' -bench OwnedClusterCPU -benchtime 100000x ./distributed/gossip/
func BenchmarkOwnedClusterCPU(b *testing.B) {
	const perNode, callers = 16000, 2
	nodes, lims := udpOwnedCluster(b, 3, nil)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	per := b.N / (len(nodes) * callers) // asks per caller
	rate := float64(perNode) / callers  // a caller's asks a second
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	var st0 []OwnedStats
	for _, l := range lims {
		st0 = append(st0, l.Stats())
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	for i, l := range lims {
		for c := range callers {
			wg.Go(func() {
				asks := make([]Ask, 0, 256)
				var took []time.Duration
				defer func() { mu.Lock(); lat = append(lat, took...); mu.Unlock() }()
				start, done := time.Now(), 0
				for k := (i*callers + c) * 7919; done < per; {
					due := min(int(time.Since(start).Seconds()*rate), per) - done
					if due <= 0 {
						time.Sleep(time.Millisecond)
						continue
					}
					due = min(due, cap(asks))
					asks = asks[:0]
					for range due {
						k = (k + 104729) % len(keys)
						asks = append(asks, Ask{Key: keys[k], N: 1})
					}
					t0 := time.Now()
					l.AllowMany(context.Background(), asks)
					took = append(took, time.Since(t0))
					done += due
				}
			})
		}
	}
	wg.Wait()
	b.StopTimer()
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano()+ru.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	decided := per * len(nodes) * callers
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(decided), "cpu-ns/op")
	var st OwnedStats
	for i, l := range lims {
		s := l.Stats()
		st.Forwarded += s.Forwarded - st0[i].Forwarded
		st.Batches += s.Batches - st0[i].Batches
		st.Fallback += s.Fallback - st0[i].Fallback
	}
	if st.Batches > 0 {
		b.ReportMetric(float64(st.Forwarded)/float64(st.Batches), "asks/datagram")
	}
	b.ReportMetric(float64(st.Fallback), "fallbacks")
	reportLatency(b, lat)
}

// reportLatency reports the median and 99th percentile of lat, if any.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
