package throttleprom_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/throttleprom"
	"github.com/throttlekit/throttle/tokenbucket"
)

func Example() {
	obs := throttleprom.New()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(obs)

	tb, err := tokenbucket.New(throttle.PerSecond(10), 2)
	if err != nil {
		panic(err)
	}
	l := throttle.Observe(tb, "api", obs)
	for i := 0; i < 3; i++ {
		l.Allow(context.Background(), "client-1", 1)
	}
	n, _ := testutil.GatherAndCount(reg, "throttle_decisions_total")
	fmt.Println(n, "decision series for one limiter")
	// Output: 3 decision series for one limiter
}

// Backend latency with buckets sized for a backend across a region.
func ExampleWithLatencyBuckets() {
	obs := throttleprom.New(throttleprom.WithLatencyBuckets(.005, .01, .025, .05, .1, .25))
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	obs.Observe(throttle.Event{Kind: throttle.EventDecision, Limiter: "redis",
		Decision: throttle.Decision{Allowed: true}, Latency: 12 * time.Millisecond})
	n, _ := testutil.GatherAndCount(reg, "throttle_backend_latency_seconds")
	fmt.Println(n, "latency histogram")
	// Output: 1 latency histogram
}
