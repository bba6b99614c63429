// Package throttleprom exports the Events of throttle limiters as
// Prometheus metrics.
//
// An Observer is a throttle.Observer and a prometheus.Collector: register
// it, and hand it to throttle.Observe (or a backend's observer option):
//
//	obs := throttleprom.New()
//	prometheus.MustRegister(obs)
//	l = throttle.Observe(l, "api", obs)
//
// Metrics (the namespace defaults to "throttle"):
//
//	throttle_decisions_total{limiter, outcome}  calls, outcome "allowed", "denied" or "error"
//	throttle_fallbacks_total{limiter, outcome}  calls a failure policy decided, "allowed" or "denied"
//	throttle_breaker_open{limiter}              1 while the circuit breaker is open, else 0
//	throttle_warnings_total{limiter}            conditions an operator should see
//
// Labels are the limiter's name and the outcome only: never the key, so
// the number of series stays that of the limiters. A call refused by a
// deny list (an error wrapping throttle.ErrDenied) counts as "denied".
package throttleprom

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/throttlekit/throttle"
)

var (
	_ throttle.Observer    = (*Observer)(nil)
	_ prometheus.Collector = (*Observer)(nil)
)

// Option configures New.
type Option func(*config)

type config struct {
	namespace   string
	constLabels prometheus.Labels
}

// WithNamespace prefixes the metric names with ns instead of "throttle".
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithConstLabels adds labels with fixed values to every metric (a
// service name, say).
func WithConstLabels(l prometheus.Labels) Option { return func(c *config) { c.constLabels = l } }

// Observer counts Events as Prometheus metrics. Observe is safe for
// concurrent use and, once a limiter's name has been seen, does not
// allocate. Create it with New; the zero value is not usable.
type Observer struct {
	decisions *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	breaker   *prometheus.GaugeVec
	warnings  *prometheus.CounterVec

	byName atomic.Pointer[map[string]*series] // copied on write
	mu     sync.Mutex                         // serializes writers of byName
}

// series are one limiter's metrics, resolved once.
type series struct {
	allowed, denied, errored     prometheus.Counter
	fbAllowed, fbDenied, warning prometheus.Counter
	breaker                      prometheus.Gauge
}

// New returns an Observer; register it with a prometheus.Registerer.
func New(opts ...Option) *Observer {
	c := config{namespace: "throttle"}
	for _, o := range opts {
		o(&c)
	}
	opt := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: c.namespace, Name: name, Help: help, ConstLabels: c.constLabels}
	}
	o := &Observer{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts(opt("decisions_total",
			"Calls to a limiter by outcome: allowed, denied or error.")), []string{"limiter", "outcome"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts(opt("fallbacks_total",
			"Calls decided by a failure policy because the backend failed, by outcome.")), []string{"limiter", "outcome"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts(opt("breaker_open",
			"1 while the limiter's circuit breaker is open, else 0.")), []string{"limiter"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts(opt("warnings_total",
			"Conditions an operator should see (an unsafe backend, a rejected reload).")), []string{"limiter"}),
	}
	o.byName.Store(&map[string]*series{})
	return o
}

func (o *Observer) series(name string) *series {
	if s := (*o.byName.Load())[name]; s != nil {
		return s
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byName.Load()
	if s := old[name]; s != nil {
		return s
	}
	s := &series{
		allowed:   o.decisions.WithLabelValues(name, "allowed"),
		denied:    o.decisions.WithLabelValues(name, "denied"),
		errored:   o.decisions.WithLabelValues(name, "error"),
		fbAllowed: o.fallbacks.WithLabelValues(name, "allowed"),
		fbDenied:  o.fallbacks.WithLabelValues(name, "denied"),
		warning:   o.warnings.WithLabelValues(name),
		breaker:   o.breaker.WithLabelValues(name),
	}
	next := make(map[string]*series, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = s
	o.byName.Store(&next)
	return s
}

// Observe counts e.
func (o *Observer) Observe(e throttle.Event) {
	s := o.series(e.Limiter)
	switch e.Kind {
	case throttle.EventDecision:
		if e.Decision.Allowed {
			s.allowed.Inc()
		} else {
			s.denied.Inc()
		}
	case throttle.EventError:
		if errors.Is(e.Err, throttle.ErrDenied) {
			s.denied.Inc()
		} else {
			s.errored.Inc()
		}
	case throttle.EventFallback:
		if e.Decision.Allowed {
			s.fbAllowed.Inc()
		} else {
			s.fbDenied.Inc()
		}
	case throttle.EventBreakerOpen:
		s.breaker.Set(1)
	case throttle.EventBreakerClosed:
		s.breaker.Set(0)
	case throttle.EventWarning:
		s.warning.Inc()
	}
}

// Describe sends the descriptors of the metrics.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	o.decisions.Describe(ch)
	o.fallbacks.Describe(ch)
	o.breaker.Describe(ch)
	o.warnings.Describe(ch)
}

// Collect sends the current values.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	o.decisions.Collect(ch)
	o.fallbacks.Collect(ch)
	o.breaker.Collect(ch)
	o.warnings.Collect(ch)
}
