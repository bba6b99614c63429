// Command tour shows real decisions of every limiter in this module on the
// same traffic, on a virtual clock so that the run is instant and the same
// every time:
//
//	go run ./examples/tour
//
// Each limiter allows 5 requests per second (burst 5). The client sends a
// burst of 8 requests just before a one-second boundary, 8 more just after
// it (the boundary attack on fixed windows), then one request every 100 ms
// (twice the allowed rate). A concurrency limit of 5 is shown last.
package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/fixedwindow"
	"github.com/throttlekit/throttle/leakybucket"
	"github.com/throttlekit/throttle/slidinglog"
	"github.com/throttlekit/throttle/slidingwindow"
	"github.com/throttlekit/throttle/throttletest"
	"github.com/throttlekit/throttle/tokenbucket"
)

const limit = 5

type subject struct {
	name string
	make func(opt throttle.Option) (throttle.Limiter, error)
}

var subjects = []subject{
	{"tokenbucket (GCRA)", func(o throttle.Option) (throttle.Limiter, error) {
		return tokenbucket.New(throttle.PerSecond(limit), limit, o)
	}},
	{"leakybucket (meter)", func(o throttle.Option) (throttle.Limiter, error) {
		return leakybucket.New(throttle.PerSecond(limit), limit, o)
	}},
	{"fixedwindow", func(o throttle.Option) (throttle.Limiter, error) {
		return fixedwindow.New(limit, time.Second, o)
	}},
	{"slidingwindow (weighted)", func(o throttle.Option) (throttle.Limiter, error) {
		return slidingwindow.New(limit, time.Second, o)
	}},
	{"slidingwindow (10 slots)", func(o throttle.Option) (throttle.Limiter, error) {
		return slidingwindow.NewSlotted(limit, time.Second, 10, o)
	}},
	{"slidinglog (exact)", func(o throttle.Option) (throttle.Limiter, error) {
		return slidinglog.New(limit, time.Second, o)
	}},
}

// arrivals returns the request times of the trace, from the clock's start.
func arrivals() []time.Duration {
	var at []time.Duration
	for i := range 8 {
		at = append(at, 900*time.Millisecond+time.Duration(i)*10*time.Millisecond)
	}
	for i := range 8 {
		at = append(at, 1010*time.Millisecond+time.Duration(i)*10*time.Millisecond)
	}
	for t := 1200 * time.Millisecond; t < 3200*time.Millisecond; t += 100 * time.Millisecond {
		at = append(at, t)
	}
	return at
}

func main() {
	ctx := context.Background()
	fmt.Printf("%d/s, burst %d. Requests: 8 at 0.90–0.97 s, 8 at 1.01–1.08 s, then 1 per 100 ms until 3.2 s.\n", limit, limit)
	fmt.Println("O = allowed, . = denied; the line shows the three phases separated by |")
	fmt.Println()
	for _, s := range subjects {
		clk := throttletest.NewClock()
		clk.Set(clk.Now().Truncate(time.Second)) // start on a window boundary
		start := clk.Now()
		l, err := s.make(throttle.WithClock(clk))
		if err != nil {
			log.Fatalf("%s: %v", s.name, err)
		}
		var line strings.Builder
		admitted, maxInSecond := 0, 0
		var times []time.Time
		for i, at := range arrivals() {
			clk.Set(start.Add(at))
			if i == 8 || i == 16 {
				line.WriteByte('|')
			}
			d, err := l.Allow(ctx, "client", 1)
			if err != nil {
				log.Fatalf("%s: %v", s.name, err)
			}
			if !d.Allowed {
				line.WriteByte('.')
				continue
			}
			line.WriteByte('O')
			admitted++
			times = append(times, clk.Now())
			inSecond := 0
			for _, t := range times {
				if clk.Now().Sub(t) < time.Second {
					inSecond++
				}
			}
			maxInSecond = max(maxInSecond, inSecond)
		}
		fmt.Printf("%-26s %s  admitted %2d, most in any 1 s: %d\n", s.name, line.String(), admitted, maxInSecond)
	}

	fmt.Println()
	sem, err := counting.New(limit)
	if err != nil {
		log.Fatal(err)
	}
	var line strings.Builder
	for range 7 {
		d, _ := sem.Allow(ctx, "db", 1)
		line.WriteString(map[bool]string{true: "O", false: "."}[d.Allowed])
	}
	if err := sem.Release("db", 2); err != nil {
		log.Fatal(err)
	}
	d, _ := sem.Allow(ctx, "db", 2)
	fmt.Printf("%-26s 7 acquires: %s; release 2, acquire 2: allowed=%v remaining=%d\n", "counting (5 in flight)", line.String(), d.Allowed, d.Remaining)
}
