package faultsim

import (
	"container/heap"
	"slices"
	"sync"
	"time"
)

// Net is a message fabric on virtual time: components' in-memory
// transports route every message through it; link faults of the schedule
// (Loss … Flap, and Pause/Crash of a process: its messages are not
// delivered while it is down) are applied by Net itself. Deliveries happen
// on Net's own goroutine in (time, sequence) order, and every random
// choice on a link comes from a generator derived from (seed, from, to,
// message number on that link), so interleavings elsewhere do not change
// it. It is safe for concurrent use; make it with NewNet inside the
// bubble (Run does).
type Net struct {
	mu     sync.Mutex
	seed   uint64
	procs  int
	base   time.Duration
	start  time.Time
	sent   map[[2]int]uint64 // messages sent per link
	faults []Event           // the link faults in force
	down   []bool
	q      queue
	seq    uint64
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	closed bool
	stats  NetStats
}

// NetStats counts what happened to the messages of a Net.
type NetStats struct {
	Sent, Delivered, Lost, Blocked, Duplicated, DownDropped uint64
}

type item struct {
	at       time.Time
	seq      uint64
	from, to int
	deliver  func()
}

type queue []item

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	return q[i].at.Before(q[j].at) || q[i].at.Equal(q[j].at) && q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(item)) }
func (q *queue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// NewNet returns a fabric among procs processes whose links have one-way
// delay base before faults, and starts its delivery goroutine; Close
// stops it.
func NewNet(seed uint64, procs int, base time.Duration) *Net {
	n := &Net{seed: seed, procs: procs, base: base, start: time.Now(), sent: map[[2]int]uint64{},
		down: make([]bool, procs), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go n.loop()
	return n
}

// Close stops delivering; messages still in flight are dropped.
func (n *Net) Close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.mu.Unlock()
	close(n.stop)
	<-n.done
}

// Stats returns the message counts so far.
func (n *Net) Stats() NetStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Start puts a link fault in force (Run calls it at e.At).
func (n *Net) Start(e Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = append(n.faults, e)
}

// End ends a link fault (Run calls it at e.At+e.Dur).
func (n *Net) End(e Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i := slices.IndexFunc(n.faults, func(f Event) bool { return sameEvent(f, e) }); i >= 0 {
		n.faults = slices.Delete(n.faults, i, i+1)
	}
}

func sameEvent(a, b Event) bool {
	return a.At == b.At && a.Kind == b.Kind && a.From == b.From && a.To == b.To && a.Dur == b.Dur && a.D == b.D && a.P == b.P
}

// SetUp marks proc up or down (paused or crashed: Run calls it).
func (n *Net) SetUp(proc int, up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if proc >= 0 && proc < n.procs {
		n.down[proc] = !up
	}
}

// Up reports whether proc is up: false while paused or crashed.
func (n *Net) Up(proc int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.upLocked(proc)
}

func (n *Net) upLocked(p int) bool { return p < 0 || p >= n.procs || !n.down[p] }

// Reachable reports whether a message from → to can get through now: both
// are up and no partition separates them (loss aside). A connection-style
// transport fails a call fast when it is false.
func (n *Net) Reachable(from, to int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.upLocked(from) && n.upLocked(to) && !n.blockedLocked(from, to, time.Now())
}

// blockedLocked reports whether a partition in force drops from → to.
func (n *Net) blockedLocked(from, to int, now time.Time) bool {
	for _, f := range n.faults {
		switch f.Kind {
		case OneWay:
			if f.From == from && f.To == to {
				return true
			}
		case Cut, Split3:
			if apart(f.Groups, from, to) {
				return true
			}
		case Flap:
			phase := now.Sub(n.start.Add(f.At)) / max(f.D, time.Nanosecond)
			if phase%2 == 0 && apart(f.Groups, from, to) {
				return true
			}
		}
	}
	return false
}

// apart reports whether a and b are in different groups; a process in
// none is cut off from every other.
func apart(groups [][]int, a, b int) bool {
	if a == b {
		return false
	}
	for _, g := range groups {
		if slices.Contains(g, a) {
			return !slices.Contains(g, b)
		}
	}
	return true
}

// Latency returns the one-way delay a message from → to takes now: the
// base (plus the link's fixed offset, under a microsecond), the spikes of
// either end, and a draw of the link's Delay faults (one message number
// of the link is used for it).
func (n *Net) Latency(from, to int) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, _, _ := n.draw(from, to)
	return d
}

// draw uses the next message number of from → to and returns its delay,
// whether it is lost and whether it is duplicated; n.mu is held.
func (n *Net) draw(from, to int) (delay time.Duration, lost, dup bool) {
	k := [2]int{from, to}
	num := n.sent[k]
	n.sent[k] = num + 1
	h := mix(n.seed, uint64(from), uint64(to), num)
	// A fixed offset per link below a microsecond: messages that different
	// senders send at the same instant arrive in an order set by the seed,
	// not by which goroutine ran first.
	delay = n.base + time.Duration(mix(n.seed, uint64(from), uint64(to))%1000)
	for i, f := range n.faults {
		switch {
		case f.Kind == Spike && (f.From == from || f.From == to || f.From == -1):
			delay += f.D
		case f.Kind == Delay && f.From == from && f.To == to && f.D > 0:
			delay += time.Duration(unit(h, uint64(i)*3) * float64(f.D))
		case f.Kind == Loss && f.From == from && f.To == to:
			lost = lost || unit(h, uint64(i)*3+1) < f.P
		case f.Kind == Duplicate && f.From == from && f.To == to:
			dup = dup || unit(h, uint64(i)*3+2) < f.P
		}
	}
	return delay, lost, dup
}

// Send sends a message from → to: deliver runs on Net's goroutine at its
// arrival, unless it is lost, and twice if it is duplicated. A message is
// dropped when its sender is down at sending, when a partition separates
// the two at sending or at arrival, and when the receiver is down at
// arrival. deliver must not block (hand the message to a goroutine).
func (n *Net) Send(from, to int, deliver func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.stats.Sent++
	now := time.Now()
	if !n.upLocked(from) {
		n.stats.DownDropped++
		return
	}
	if n.blockedLocked(from, to, now) {
		n.stats.Blocked++
		return
	}
	d, lost, dup := n.draw(from, to)
	if lost {
		n.stats.Lost++
		return
	}
	n.pushLocked(now.Add(d), from, to, deliver)
	if dup {
		n.stats.Duplicated++
		d2, _, _ := n.draw(from, to)
		n.pushLocked(now.Add(d2), from, to, deliver)
	}
}

func (n *Net) pushLocked(at time.Time, from, to int, deliver func()) {
	n.seq++
	heap.Push(&n.q, item{at: at, seq: n.seq, from: from, to: to, deliver: deliver})
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// loop delivers the queued messages in (time, sequence) order.
func (n *Net) loop() {
	defer close(n.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		n.mu.Lock()
		wait := time.Duration(-1)
		var due []item
		now := time.Now()
		for n.q.Len() > 0 && !n.q[0].at.After(now) {
			due = append(due, heap.Pop(&n.q).(item))
		}
		if n.q.Len() > 0 {
			wait = n.q[0].at.Sub(now)
		}
		n.mu.Unlock()
		for _, it := range due {
			n.arrive(it)
		}
		if len(due) > 0 {
			continue
		}
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-n.stop:
			return
		case <-n.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// arrive delivers it unless its receiver is down or cut off from its
// sender now.
func (n *Net) arrive(it item) {
	n.mu.Lock()
	ok := n.upLocked(it.to) && !n.blockedLocked(it.from, it.to, time.Now())
	if ok {
		n.stats.Delivered++
	} else {
		n.stats.DownDropped++
	}
	n.mu.Unlock()
	if ok {
		it.deliver()
	}
}

// mix hashes its arguments into 64 well-mixed bits (splitmix64 steps).
func mix(xs ...uint64) uint64 {
	var h uint64 = 0x9e3779b97f4a7c15
	for _, x := range xs {
		h ^= x + 0x9e3779b97f4a7c15 + h<<6 + h>>2
		h = splitmix(h)
	}
	return h
}

func splitmix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// unit is a uniform draw in [0, 1) from h and a salt.
func unit(h, salt uint64) float64 {
	return float64(splitmix(h^salt*0xd1b54a32d192ed03)>>11) / (1 << 53)
}
