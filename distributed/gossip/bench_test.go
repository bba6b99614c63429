package gossip

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func benchLimiter(b *testing.B, capped bool, peers int, rate throttle.Rate, burst int) *Limiter {
	clk := throttletest.NewClock()
	net := NewNetwork(clk, 1)
	var ps []string
	for i := range peers {
		ps = append(ps, fmt.Sprintf("p%d", i))
	}
	n, err := NewNode(Config{Transport: net.Endpoint("self"), Secret: secret, Peers: ps, SpendCap: capped})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	l, err := n.NewLimiter("api", rate, burst)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkAllow measures one decision on the real clock: admitted (a
// huge rate) and denied (a tiny one), serial and parallel, with and
// without the spend cap (8 peers).
func BenchmarkAllow(b *testing.B) {
	for _, capped := range []bool{false, true} {
		for _, mode := range []string{"allowed", "denied"} {
			rate, burst := throttle.PerSecond(1), 1_000_000_000
			if mode == "denied" {
				rate, burst = throttle.PerHour(1), 1
			}
			name := fmt.Sprintf("cap=%v/%s", capped, mode)
			b.Run(name+"/serial", func(b *testing.B) {
				l := benchLimiter(b, capped, 7, rate, burst)
				keys := make([]string, 1024)
				for i := range keys {
					keys[i] = "client-" + strconv.Itoa(i)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					l.Allow(ctx, keys[i&1023], 1)
				}
			})
			b.Run(name+"/parallel", func(b *testing.B) {
				l := benchLimiter(b, capped, 7, rate, burst)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					keys := make([]string, 1024)
					for i := range keys {
						keys[i] = "client-" + strconv.Itoa(i)
					}
					i := 0
					for pb.Next() {
						l.Allow(ctx, keys[i&1023], 1)
						i++
					}
				})
			})
		}
	}
}

// BenchmarkBaseline is the same decision on a bare token bucket, for the
// cost of the gossip layer.
func BenchmarkBaseline(b *testing.B) {
	for _, mode := range []string{"allowed", "denied"} {
		rate, burst := throttle.PerSecond(1), 1_000_000_000
		if mode == "denied" {
			rate, burst = throttle.PerHour(1), 1
		}
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = "client-" + strconv.Itoa(i)
		}
		b.Run(mode+"/serial", func(b *testing.B) {
			l, _ := tokenbucket.New(rate, burst)
			defer l.Close()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				l.Allow(ctx, keys[i&1023], 1)
			}
		})
		b.Run(mode+"/parallel", func(b *testing.B) {
			l, _ := tokenbucket.New(rate, burst)
			defer l.Close()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					l.Allow(ctx, keys[i&1023], 1)
					i++
				}
			})
		})
	}
}

// BenchmarkRound measures one gossip round with 10,000 changed keys and 7
// peers: encoding, signing and sending.
func BenchmarkRound(b *testing.B) {
	clk := throttletest.NewClock()
	net := NewNetwork(clk, 1)
	n, _ := NewNode(Config{Transport: net.Endpoint("self"), Secret: secret, Peers: []string{"a", "b", "c", "d", "e", "f", "g"}},
		throttle.WithClock(clk))
	defer n.Close()
	l, _ := n.NewLimiter("api", throttle.PerSecond(100), 100)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := range 10000 {
			l.Allow(ctx, "client-"+strconv.Itoa(i), 1)
		}
		clk.Advance(time.Second)
		b.StartTimer()
		n.Tick()
		b.StopTimer()
		for net.Pending() > 0 {
			clk.Advance(time.Hour) // drop what nobody receives
			net.Deliver()
		}
		b.StartTimer()
	}
	st := n.Stats()
	b.ReportMetric(float64(st.PacketsSent)/float64(st.Rounds), "datagrams/round")
	b.ReportMetric(float64(st.BytesSent)/float64(st.PacketsSent), "bytes/datagram")
}

// BenchmarkSim runs the simulation (N nodes, random load balancer, a
// client at 3x its rate for 120 s of virtual time, 1 s interval) and
// reports its accuracy: admitted/ideal and peak burst/configured burst,
// and its cost: gossip bytes sent per node and interval. copies is
// Config.Copies.
//
//	go test ./distributed/gossip -run XXX -bench Sim -benchtime 1x
func BenchmarkSim(b *testing.B) {
	for _, nodes := range []int{1, 4, 8, 16} {
		for _, capped := range []bool{false, true} {
			for _, loss := range []float64{0, 0.05, 0.20} {
				for _, copies := range []int{1, DefaultCopies, 3} {
					b.Run(fmt.Sprintf("nodes=%d/cap=%v/loss=%v/copies=%d", nodes, capped, loss, copies), func(b *testing.B) {
						var r simResult
						for b.Loop() {
							r = simulate(b, simConfig{nodes: nodes, rate: throttle.PerSecond(50), burst: 100, interval: time.Second,
								capped: capped, loss: loss, dup: 0.02, over: 3, duration: 120 * time.Second, seed: 3, copies: copies})
						}
						b.ReportMetric(r.ratio, "admitted/ideal")
						b.ReportMetric(r.peak, "peak/burst")
						b.ReportMetric(r.bytes, "bytes/node/interval")
					})
				}
			}
		}
	}
}
