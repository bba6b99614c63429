package testproc

import (
	"sync"
	"time"
)

// Sampler reads a sum in the background at a fixed interval, for tests
// that check a bound where it can break (what the clients of a service
// enforce, summed), and records the worst value and, per step of the
// test, how long the sum was above the bound. Its methods are safe for
// concurrent use.
type Sampler struct {
	bound float64
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	mu    sync.Mutex
	step  string
	worst float64
	over  map[string]time.Duration
}

// Sample starts reading sum every interval until Stop.
func Sample(every time.Duration, bound float64, sum func() float64) *Sampler {
	s := &Sampler{bound: bound, stop: make(chan struct{}), done: make(chan struct{}), over: map[string]time.Duration{}}
	go s.loop(every, sum)
	return s
}

func (s *Sampler) loop(every time.Duration, sum func() float64) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		v := sum()
		s.mu.Lock()
		s.worst = max(s.worst, v)
		if v > s.bound*(1+1e-9) {
			s.over[s.step] += every
		}
		s.mu.Unlock()
	}
}

// Step names the step of the test that the next samples belong to.
func (s *Sampler) Step(name string) {
	s.mu.Lock()
	s.step = name
	s.mu.Unlock()
}

// Stop stops sampling and returns the worst sum read and, per step, how
// long the sum was above the bound (empty when it never was).
func (s *Sampler) Stop() (worst float64, over map[string]time.Duration) {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worst, s.over
}
