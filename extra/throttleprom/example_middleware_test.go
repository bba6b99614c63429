package throttleprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/extra/throttleprom"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// The HTTP middleware over an observed limiter: every decision it asks
// for is counted under the limiter's name, never per client.
func Example_middleware() {
	obs := throttleprom.New()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(obs)

	perClient, err := tokenbucket.New(throttle.NewRate(60, time.Minute), 2)
	if err != nil {
		panic(err)
	}
	defer perClient.Close()
	limit, err := httplimit.New(throttle.Observe(perClient, "api", obs), httplimit.WithName("api"))
	if err != nil {
		panic(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, client := range []string{"192.0.2.1", "192.0.2.1", "192.0.2.1", "192.0.2.2"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = client + ":1234"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	// Serve reg's metrics with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
	decisions, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range decisions {
		if mf.GetName() != "throttle_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			if v := m.GetCounter().GetValue(); v > 0 {
				fmt.Printf("%s%v\n", labels, v)
			}
		}
	}
	// Output:
	// limiter=api outcome=allowed 3
	// limiter=api outcome=denied 1
}
