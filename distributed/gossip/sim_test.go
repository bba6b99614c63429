package gossip

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/gossipnet"
	"github.com/throttlekit/throttle/throttletest"
)

// cluster is N nodes on an in-memory network and a virtual clock.
type cluster struct {
	t        testing.TB
	clk      *throttletest.Clock
	net      *gossipnet.Network
	nodes    []*Node
	lims     []*Limiter
	addrs    []string
	interval time.Duration
}

// newNode makes a node with cfg and opts and its limiter "api" at rate
// and burst; the caller closes the node.
func newNode(t testing.TB, cfg Config, rate throttle.Rate, burst int, opts ...throttle.Option) (*Node, *Limiter) {
	t.Helper()
	n, err := NewNode(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := n.NewLimiter("api", rate, burst)
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	return n, l
}

func newCluster(t testing.TB, n int, rate throttle.Rate, burst int, interval time.Duration, capped bool, seed uint64, opts ...func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, clk: throttletest.NewClock(), interval: interval}
	c.net = newNetwork(c.clk, seed)
	c.net.SetDelay(10*time.Millisecond*interval/time.Second, 0)
	for i := range n {
		c.addrs = append(c.addrs, fmt.Sprintf("n%d", i))
	}
	for i := range n {
		cfg := Config{Transport: c.net.Endpoint(c.addrs[i]), Secret: secret, Peers: c.addrs,
			Interval: interval, SpendCap: capped}
		for _, o := range opts {
			o(&cfg)
		}
		node, l := newNode(t, cfg, rate, burst, throttle.WithClock(c.clk))
		c.nodes = append(c.nodes, node)
		c.lims = append(c.lims, l)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Close()
		}
	})
	// The first round's datagrams arrive at once: until a node has heard
	// every peer start with it, it cannot tell the cluster's first start
	// from its own restart, and decides conservatively (see
	// Node.gateStart).
	c.net.SetDelay(0, 0)
	c.runTo(c.clk.Now())
	c.net.SetDelay(10*time.Millisecond*interval/time.Second, 0)
	return c
}

// settle runs the cluster past the delivery of the current round's
// datagrams: until a peer's arrive, it is pending, and the spend cap
// sets aside what it may have spent (see Limiter.shares).
func (c *cluster) settle() { c.runTo(c.clk.Now().Add(2 * c.interval / 100)) }

// runTo advances virtual time to end, running every round boundary and
// every delivery on the way, in time order.
func (c *cluster) runTo(end time.Time) {
	iv := int64(c.interval)
	for {
		now := c.clk.Now()
		for _, n := range c.nodes {
			n.Tick()
		}
		c.net.Deliver()
		if !now.Before(end) {
			return
		}
		next := end
		if b := time.Unix(0, (now.UnixNano()/iv+1)*iv); b.Before(next) {
			next = b
		}
		if d, ok := c.net.NextDue(); ok && d.After(now) && d.Before(next) {
			next = d
		}
		c.clk.Set(next)
	}
}

type simConfig struct {
	nodes    int
	rate     throttle.Rate
	burst    int
	interval time.Duration
	capped   bool
	loss     float64
	dup      float64
	jitter   time.Duration
	over     float64 // client rate as a multiple of rate
	duration time.Duration
	seed     uint64
	copies   int // Config.Copies; 0 for the default
}

// withCopies sets Config.Copies (0 keeps the default).
func withCopies(k int) func(*Config) { return func(c *Config) { c.Copies = k } }

type simResult struct {
	admitted, ideal int64
	ratio           float64 // admitted / ideal
	peak            float64 // peak burst (max over windows of admitted - rate*window) / burst
	bytes           float64 // gossip bytes sent per node and interval
}

// simulate drives one client over its rate through a random load
// balancer and measures the long-run ratio and the peak burst.
func simulate(t testing.TB, s simConfig) simResult {
	c := newCluster(t, s.nodes, s.rate, s.burst, s.interval, s.capped, s.seed, withCopies(s.copies))
	c.net.SetLoss(s.loss)
	c.net.SetDuplicate(s.dup)
	c.net.SetDelay(c.interval/100, s.jitter)
	rng := rand.New(rand.NewPCG(s.seed, 7))
	perSec := float64(s.rate.Count()) / s.rate.Period().Seconds()
	gap := time.Duration(float64(time.Second) / (perSec * s.over))
	start := c.clk.Now()
	end := start.Add(s.duration)
	var res simResult
	var best, minBase float64 // peak burst: max_j (j+1 - rate*t_j) - min_{i<=j} (i - rate*t_i)
	minBase = math.Inf(1)
	var k float64
	for at := start; at.Before(end); at = at.Add(time.Duration(rng.ExpFloat64() * float64(gap))) {
		c.runTo(at)
		d, err := c.lims[rng.IntN(s.nodes)].Allow(ctx, "client", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			x := at.Sub(start).Seconds() * perSec
			minBase = min(minBase, k-x)
			k++
			best = max(best, k-x-minBase)
			res.admitted++
		}
	}
	c.runTo(end)
	var sent uint64
	for _, n := range c.nodes {
		sent += n.Stats().BytesSent
	}
	res.bytes = float64(sent) / float64(s.nodes) / (float64(s.duration) / float64(s.interval))
	res.ideal = int64(s.burst) + s.rate.Events(s.duration)
	res.ratio = float64(res.admitted) / float64(res.ideal)
	res.peak = best / float64(s.burst)
	return res
}

// The long-run goal: with 8 nodes, admitted/ideal within 1% at 0, 5 and
// 20% loss, with and without the spend cap.
func TestSimLongRun(t *testing.T) {
	for _, capped := range []bool{false, true} {
		for _, loss := range []float64{0, 0.05, 0.20} {
			for _, iv := range []time.Duration{time.Second, 100 * time.Millisecond} {
				if race && (loss != 0.20 || iv != time.Second) {
					continue // the race detector makes the full grid slow
				}
				name := fmt.Sprintf("cap=%v/loss=%v/interval=%v", capped, loss, iv)
				t.Run(name, func(t *testing.T) {
					r := simulate(t, simConfig{nodes: 8, rate: throttle.PerSecond(50), burst: 100, interval: iv,
						capped: capped, loss: loss, dup: 0.02, jitter: iv / 20, over: 3, duration: 120 * time.Second, seed: 3})
					t.Logf("%s: admitted %d, ideal %d, ratio %.4f, peak burst %.2fx", name, r.admitted, r.ideal, r.ratio, r.peak)
					if math.Abs(r.ratio-1) > 0.01 {
						t.Errorf("long-run admitted/ideal = %.4f, want within 1%%", r.ratio)
					}
				})
			}
		}
	}
}

// burstFlood sends count requests at one instant, spread at random over
// the nodes of a fresh cluster, and returns how many were admitted.
func burstFlood(t testing.TB, nodes, burst, count int, capped bool, seed uint64) int {
	c := newCluster(t, nodes, throttle.PerSecond(10), burst, time.Second, capped, seed)
	c.runTo(c.clk.Now().Add(100 * time.Millisecond))
	rng := rand.New(rand.NewPCG(seed, 9))
	admitted := 0
	for range count {
		if d, _ := c.lims[rng.IntN(nodes)].Allow(ctx, "client", 1); d.Allowed {
			admitted++
		}
	}
	return admitted
}

// The burst goal: a client flooding all 8 nodes at once gets at most 1.2x
// the configured burst with the spend cap (N times it without).
func TestSimBurst(t *testing.T) {
	const burst = 100
	for _, n := range []int{1, 2, 4, 8, 16} {
		capped := burstFlood(t, n, burst, 20*burst, true, uint64(n))
		free := burstFlood(t, n, burst, 20*burst, false, uint64(n))
		t.Logf("nodes=%2d flood of %d: admitted %d with the spend cap (%.2fx), %d without (%.2fx)",
			n, 20*burst, capped, float64(capped)/burst, free, float64(free)/burst)
		if capped > burst {
			t.Errorf("nodes=%d: admitted %d with the spend cap, want at most burst=%d", n, capped, burst)
		}
		if free != n*burst {
			t.Errorf("nodes=%d: admitted %d without the cap, want the known N*burst=%d", n, free, n*burst)
		}
	}
	// Under sustained random traffic, the peak burst with the cap.
	for _, loss := range []float64{0, 0.05, 0.20} {
		r := simulate(t, simConfig{nodes: 8, rate: throttle.PerSecond(50), burst: 100, interval: 100 * time.Millisecond,
			capped: true, loss: loss, over: 3, duration: 30 * time.Second, seed: 5})
		t.Logf("sustained, loss %.0f%%: peak burst %.2fx (cap)", loss*100, r.peak)
		if loss == 0 && r.peak*100 > 100+7 {
			t.Errorf("no loss: peak burst %.0f units, above the stated bound burst + N-1 = 107", r.peak*100)
		}
		if r.peak > 1.2 {
			t.Errorf("loss %.0f%%: peak burst %.2fx with the cap, want <= 1.2x", loss*100, r.peak)
		}
	}
	// With a 1 s interval, over eight seeds: the first reports of a new
	// key are the ones whose loss hurts the cap most (no hit rate to go
	// on yet), which Config.Copies makes rare.
	for _, loss := range []float64{0.05, 0.20} {
		worst := 0.0
		for seed := range uint64(8) {
			r := simulate(t, simConfig{nodes: 8, rate: throttle.PerSecond(50), burst: 100, interval: time.Second,
				capped: true, loss: loss, dup: 0.02, jitter: time.Second / 20, over: 3, duration: 120 * time.Second, seed: seed})
			worst = max(worst, r.peak)
		}
		t.Logf("sustained, loss %.0f%%, 1 s interval: peak burst %.2fx at worst over 8 seeds (cap)", loss*100, worst)
		if worst > 1.2 {
			t.Errorf("loss %.0f%%, 1 s interval: peak burst %.2fx with the cap, want <= 1.2x", loss*100, worst)
		}
	}
}

// converged reports whether every node has applied every peer's
// cumulative hits for key: all that was admitted anywhere is charged
// everywhere.
func (c *cluster) converged(key string) bool {
	for i, l := range c.lims {
		e := l.table.load(key)
		for j, p := range c.lims {
			if i == j || p.Hits(key) == 0 {
				continue
			}
			if e == nil {
				return false
			}
			e.mu.Lock()
			rec := e.peerRec(c.addrs[j])
			ok := rec != nil && int64(rec.hits) == p.Hits(key)
			e.mu.Unlock()
			if !ok {
				return false
			}
		}
	}
	return true
}

// After a partition heals, every node has charged every hit made on the
// other side within two intervals on average, one with no loss; with
// three copies of each datagram, within two intervals in every run at up
// to 20% loss.
func TestSimPartitionHeal(t *testing.T) {
	for _, copies := range []int{DefaultCopies, 3} {
		for _, loss := range []float64{0, 0.05, 0.20} {
			t.Run(fmt.Sprintf("copies=%d/loss=%v", copies, loss), func(t *testing.T) {
				worst, total := 0, 0
				seeds := 20
				if race {
					seeds = 3
				}
				for seed := range uint64(seeds) {
					c := newCluster(t, 8, throttle.PerSecond(50), 100, time.Second, false, seed, withCopies(copies))
					c.net.SetLoss(loss)
					rng := rand.New(rand.NewPCG(seed, 1))
					c.net.Partition(c.addrs[:4], c.addrs[4:])
					start := c.clk.Now()
					heal := start.Add(10*time.Second + 300*time.Millisecond)
					for at := start; at.Before(heal); at = at.Add(2 * time.Millisecond) {
						c.runTo(at)
						c.lims[rng.IntN(8)].Allow(ctx, "client", 1) // 500/s: 10x the rate
					}
					c.runTo(heal)
					c.net.Heal()
					if c.converged("client") {
						t.Fatal("no divergence during the partition")
					}
					// The client stops; count intervals until all agree.
					rounds := 0
					for ; rounds < 20 && !c.converged("client"); rounds++ {
						c.runTo(c.clk.Now().Add(c.interval))
					}
					worst = max(worst, rounds)
					total += rounds
				}
				avg := float64(total) / float64(seeds)
				t.Logf("copies %d, loss %.0f%%: all hits charged everywhere %.2f intervals after the heal on average, %d at worst (%d runs)",
					copies, loss*100, avg, worst, seeds)
				switch {
				case loss == 0 && worst > 1:
					t.Errorf("no loss: converged after %d intervals at worst, want 1", worst)
				case avg > 2:
					t.Errorf("converged after %.2f intervals on average, want <= 2", avg)
				case (loss <= 0.05 || copies >= 3) && worst > 2:
					t.Errorf("converged after %d intervals at worst, want <= 2", worst)
				}
			})
		}
	}
}

// TestSimFloodBoundUncapped: without the spend cap, a flood of a fresh key
// on every node is admitted on each at its bucket's pace until the first
// report arrives: N x (burst + rate x time to the first report), more
// than N x burst.
func TestSimFloodBoundUncapped(t *testing.T) {
	const nodes, burst = 4, 100
	rate := throttle.PerSecond(50)
	c := newCluster(t, nodes, rate, burst, time.Second, false, 1)
	iv := int64(c.interval)
	c.runTo(time.Unix(0, (c.clk.Now().UnixNano()/iv+1)*iv).Add(time.Millisecond))
	start := c.clk.Now()
	admitted := int64(0)
	applied := func() (n uint64) {
		for _, x := range c.nodes {
			n += x.Stats().HitsApplied
		}
		return n
	}
	for at := start; applied() == 0; at = at.Add(time.Millisecond) {
		c.runTo(at)
		if applied() != 0 {
			break
		}
		for _, l := range c.lims {
			if d, _ := l.Allow(ctx, "flood", 1); d.Allowed {
				admitted++
			}
		}
	}
	first := c.clk.Now().Sub(start)
	bound := nodes * (burst + rate.Events(first))
	t.Logf("%d nodes: %d admitted before the first report arrived %v after the flood began; N x (burst + rate x that) = %d, N x burst = %d",
		nodes, admitted, first, bound, nodes*burst)
	if admitted > bound || admitted <= nodes*burst {
		t.Errorf("admitted %d, want above N x burst = %d and at most %d", admitted, nodes*burst, bound)
	}
}
