package throttleotel_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/throttleotel"
	"github.com/throttlekit/throttle/tokenbucket"
)

func Example() {
	reader := sdkmetric.NewManualReader() // in production: an OTLP or Prometheus exporter
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := throttleotel.New(mp)
	if err != nil {
		panic(err)
	}
	tb, err := tokenbucket.New(throttle.PerSecond(10), 2)
	if err != nil {
		panic(err)
	}
	l := throttle.Observe(tb, "api", obs)
	for i := 0; i < 3; i++ {
		l.Allow(context.Background(), "client-1", 1)
	}
	var rm metricdata.ResourceMetrics
	reader.Collect(context.Background(), &rm)
	for _, p := range rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Sum[int64]).DataPoints {
		outcome, _ := p.Attributes.Value("outcome")
		fmt.Println(rm.ScopeMetrics[0].Metrics[0].Name, outcome.AsString(), p.Value)
	}
	// Unordered output:
	// throttle.decisions allowed 2
	// throttle.decisions denied 1
}
