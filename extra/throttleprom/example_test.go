package throttleprom_test

import (
	"context"
	"fmt"

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
