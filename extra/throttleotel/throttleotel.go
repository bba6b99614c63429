// Package throttleotel exports the Events of throttle limiters as
// OpenTelemetry metrics through a MeterProvider.
//
//	obs, err := throttleotel.New(otel.GetMeterProvider())
//	...
//	l = throttle.Observe(l, "api", obs) // or a WithObserver("api", obs) option
//
// Instruments (of the meter named by ScopeName):
//
//	throttle.decisions  counter, attributes limiter and outcome ("allowed", "denied", "error")
//	throttle.fallbacks  counter, calls a failure policy decided, outcome "allowed" or "denied"
//	throttle.breaker.open  gauge, 1 while the limiter's circuit breaker is open, else 0
//	throttle.warnings   counter, conditions an operator should see
//
// Attributes are the limiter's name and the outcome only: never the key.
// A call refused by a deny list (an error wrapping throttle.ErrDenied)
// counts as "denied".
package throttleotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/obskit"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/throttlekit/throttle"

var _ throttle.Observer = (*Observer)(nil)

// Observer records Events on OpenTelemetry instruments. Observe is safe
// for concurrent use; once a limiter's name has been seen it builds no
// attribute set (what the SDK itself costs per measurement is measured in
// the benchmarks). Create it with New; the zero value is not usable.
type Observer struct {
	decisions, fallbacks, warnings metric.Int64Counter
	breaker                        metric.Int64Gauge
	byName                         *obskit.Cache[*series]
}

// series are one limiter's measurement options, resolved once.
type series struct {
	add    [obskit.NumOutcomes]metric.Int64Counter
	opts   [obskit.NumOutcomes][]metric.AddOption
	record []metric.RecordOption
}

// New returns an Observer recording on a meter of mp. Errors come from
// creating the instruments.
func New(mp metric.MeterProvider) (*Observer, error) {
	if mp == nil {
		return nil, fmt.Errorf("%w: throttleotel: nil MeterProvider", throttle.ErrInvalid)
	}
	m := mp.Meter(ScopeName)
	o := &Observer{}
	var err error
	if o.decisions, err = m.Int64Counter("throttle.decisions", metric.WithUnit("{call}"),
		metric.WithDescription("Calls to a limiter by outcome: allowed, denied or error.")); err != nil {
		return nil, err
	}
	if o.fallbacks, err = m.Int64Counter("throttle.fallbacks", metric.WithUnit("{call}"),
		metric.WithDescription("Calls decided by a failure policy because the backend failed, by outcome.")); err != nil {
		return nil, err
	}
	if o.warnings, err = m.Int64Counter("throttle.warnings", metric.WithUnit("{warning}"),
		metric.WithDescription("Conditions an operator should see (an unsafe backend, a rejected reload).")); err != nil {
		return nil, err
	}
	if o.breaker, err = m.Int64Gauge("throttle.breaker.open",
		metric.WithDescription("1 while the limiter's circuit breaker is open, else 0.")); err != nil {
		return nil, err
	}
	o.byName = obskit.NewCache(func(name string) *series {
		s := &series{record: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("limiter", name)))}}
		set := func(out obskit.Outcome, c metric.Int64Counter, outcome string) {
			attrs := []attribute.KeyValue{attribute.String("limiter", name)}
			if outcome != "" {
				attrs = append(attrs, attribute.String("outcome", outcome))
			}
			s.add[out] = c
			s.opts[out] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
		}
		set(obskit.Allowed, o.decisions, "allowed")
		set(obskit.Denied, o.decisions, "denied")
		set(obskit.Errored, o.decisions, "error")
		set(obskit.FallbackAllowed, o.fallbacks, "allowed")
		set(obskit.FallbackDenied, o.fallbacks, "denied")
		set(obskit.Warning, o.warnings, "")
		return s
	})
	return o, nil
}

// Observe records e.
func (o *Observer) Observe(e throttle.Event) {
	s := o.byName.Get(e.Limiter)
	ctx := context.Background()
	switch out := obskit.Of(e); out {
	case obskit.None:
	case obskit.BreakerOpen:
		o.breaker.Record(ctx, 1, s.record...)
	case obskit.BreakerClosed:
		o.breaker.Record(ctx, 0, s.record...)
	default:
		s.add[out].Add(ctx, 1, s.opts[out]...)
	}
}
