package gossip

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

func benchLimiter(b *testing.B, capped bool, peers int, rate throttle.Rate, burst int) *Limiter {
	clk := throttletest.NewClock()
	net := newNetwork(clk, 1)
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
// huge rate) and denied (a tiny one), with and without the spend cap (8
// peers); see benchAccess for the access patterns.
func BenchmarkAllow(b *testing.B) {
	for _, capped := range []bool{false, true} {
		for _, mode := range []string{"allowed", "denied"} {
			b.Run(fmt.Sprintf("cap=%v/%s", capped, mode), func(b *testing.B) {
				benchAccess(b, func() throttle.Limiter {
					rate, burst := benchRate(mode)
					return benchLimiter(b, capped, 7, rate, burst)
				})
			})
		}
	}
}

// BenchmarkBaseline is the same decision on a bare keyed token bucket, for
// the cost of the gossip layer.
func BenchmarkBaseline(b *testing.B) {
	for _, mode := range []string{"allowed", "denied"} {
		b.Run(mode, func(b *testing.B) {
			benchAccess(b, func() throttle.Limiter {
				l, err := tokenbucket.New(benchRate(mode))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { l.Close() })
				return l
			})
		})
	}
}

func benchRate(mode string) (throttle.Rate, int) {
	if mode == "denied" {
		return throttle.NewRate(1, time.Hour), 1
	}
	return throttle.PerSecond(1), 1_000_000_000
}

// benchAccess times Allow over 1024 keys: serial; parallel, each worker
// drawing keys at random (requests of many clients);
// and hotkey, every worker on one key (one client's flood).
func benchAccess(b *testing.B, newLimiter func() throttle.Limiter) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	b.Run("serial", func(b *testing.B) {
		l := newLimiter()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			l.Allow(ctx, keys[i&1023], 1)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		l := newLimiter()
		var workers atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			// Each worker draws its keys at random (xorshift): workers
			// walking the keys in step would meet on every key once one
			// catches up with another, which many clients do not do.
			x := workers.Add(1) * 0x9e3779b97f4a7c15
			for pb.Next() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				l.Allow(ctx, keys[x&1023], 1)
			}
		})
	})
	b.Run("hotkey", func(b *testing.B) {
		l := newLimiter()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow(ctx, keys[0], 1)
			}
		})
	})
}

// BenchmarkRound measures one gossip round with 10,000 changed keys and 7
// peers: encoding, signing and sending.
func BenchmarkRound(b *testing.B) {
	clk := throttletest.NewClock()
	net := newNetwork(clk, 1)
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

// BenchmarkRoundIdleKeys measures one gossip round in which 1,000 or
// 20,000 keys changed, on a node that holds many more, idle within the retention, and
// whose peer acknowledges every round: a round's work should follow the
// changed keys, not the table. THROTTLE_GOSSIP_LARGE=1 adds a table of
// 1,000,000 keys, and a round in which all of them changed: its work
// should follow what the round can carry (MaxRoundBytes), not the keys
// changed.
func BenchmarkRoundIdleKeys(b *testing.B) {
	sizes := []int{100_000}
	if os.Getenv("THROTTLE_GOSSIP_LARGE") == "1" {
		sizes = append(sizes, 1_000_000)
	}
	for _, size := range sizes {
		changes := []int{1000, 20_000}
		if size == 1_000_000 {
			changes = append(changes, size)
		}
		for _, changed := range changes {
			b.Run(fmt.Sprintf("table=%d/changed=%d", size, changed), func(b *testing.B) {
				benchRoundIdleKeys(b, size, changed)
			})
		}
	}
}

// benchRoundIdleKeys is BenchmarkRoundIdleKeys with size keys held and
// changed of them changed before each round. It reports the CPU time of
// the process per round too.
func benchRoundIdleKeys(b *testing.B, size, changed int) {
	clk := throttletest.NewClock()
	net := newNetwork(clk, 1)
	peers := []string{"self", "peer"}
	n, _ := NewNode(Config{Transport: net.Endpoint("self"), Secret: secret, Peers: peers},
		throttle.WithClock(clk), throttle.WithMaxKeys(2*size))
	defer n.Close()
	// The peer tracks few keys (the rest go under its overflow
	// key): it is there to acknowledge.
	p, _ := NewNode(Config{Transport: net.Endpoint("peer"), Secret: secret, Peers: peers},
		throttle.WithClock(clk), throttle.WithMaxKeys(1000))
	defer p.Close()
	rate, burst := throttle.PerSecond(1), 1000 // a retention of 2000 rounds
	l, _ := n.NewLimiter("api", rate, burst)
	p.NewLimiter("api", rate, burst)
	keys := make([]string, size)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
		l.Allow(ctx, keys[i], 1)
	}
	round := func() {
		p.Tick()
		net.Deliver() // no delay
	}
	// Until the peer has every key (2 MB a round): a round sends
	// it hardly more than a hello.
	for range 200 {
		sent := n.Stats().BytesSent
		clk.Advance(time.Second)
		n.Tick()
		round()
		if n.Stats().BytesSent-sent < 1000 {
			break
		}
	}
	b.ReportAllocs()
	i := 0
	var cpu int64
	for b.Loop() {
		b.StopTimer()
		for range changed {
			l.Allow(ctx, keys[i%size], 1)
			i += 7919
		}
		clk.Advance(time.Second)
		b.StartTimer()
		c := cpuTime()
		n.Tick()
		cpu += cpuTime() - c
		b.StopTimer()
		round()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkReceive measures what a node spends on each report entry a
// peer sends it: authenticating and decoding the datagram, and debiting
// the key (a table of 100,000 keys, each reported once a round). With
// BenchmarkRound's cost of sending, it says what a round costs a node
// for each key that changed on each peer.
func BenchmarkReceive(b *testing.B) {
	clk := throttletest.NewClock()
	n, err := NewNode(Config{Transport: newNetwork(clk, 1).Endpoint("n0"), Secret: secret, Peers: []string{"p"}},
		throttle.WithClock(clk), throttle.WithMaxKeys(200_000))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	n.NewLimiter("api", throttle.PerSecond(1000), 1000)
	const keys = 100_000
	sig := newSigner(secret)
	inc, seq := uint64(clk.Now().UnixNano()), uint64(0)
	var pkts [][]byte
	entries := 0
	round := func(r uint64) {
		e := &encoder{hdr: header{typ: msgReport, sender: "p", table: "api", incarnation: inc, round: r}}
		for i := range keys {
			e.addReport(reportEntry{key: "client-" + strconv.Itoa(i), born: 1, hits: r, demand: r})
		}
		bodies := e.finish()
		pkts = pkts[:0]
		for i, body := range bodies {
			seq++
			pkts = append(pkts, sig.seal(body, "n0", header{part: uint16(i), parts: uint16(len(bodies)), seq: seq}))
		}
	}
	r := uint64(1)
	round(r)
	for _, p := range pkts { // the baselines
		n.handle(p, "p")
	}
	b.ReportAllocs()
	i := len(pkts)
	cpu := cpuTime()
	for b.Loop() {
		if i == len(pkts) {
			b.StopTimer()
			r++
			clk.Advance(time.Second)
			round(r)
			i = 0
			b.StartTimer()
		}
		n.handle(pkts[i], "p")
		i++
		entries += keys / len(pkts)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(entries), "ns/entry")
	b.ReportMetric(float64(cpuTime()-cpu)/float64(entries), "cpu-ns/entry")
	if n.Stats().HitsApplied == 0 {
		b.Fatal("nothing applied")
	}
}

// cpuTime returns the CPU time the process has used (ns), which a busy
// machine does not inflate as it does the wall time of a benchmark: the
// per-round rebuild of BenchmarkReceive is in it.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
