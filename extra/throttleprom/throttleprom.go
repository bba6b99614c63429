// Package throttleprom exports the Events of throttle limiters as
// Prometheus metrics.
//
// An Observer is a throttle.Observer and a prometheus.Collector: register
// it, and hand it to throttle.Observe (or a WithObserver option):
//
//	obs := throttleprom.New()
//	prometheus.MustRegister(obs)
//	l = throttle.Observe(l, "api", obs)
//
// Metrics (the namespace defaults to "throttle"):
//
//	throttle_decisions_total{limiter, outcome}  calls, outcome "allowed", "denied" or "error"
//	throttle_fallbacks_total{limiter, outcome}  calls a failure policy decided, "allowed" or "denied" (a FailClosed refusal)
//	throttle_breaker_open{limiter}              1 while the circuit breaker is open, else 0
//	throttle_warnings_total{limiter}            conditions an operator should see
//	throttle_errors_total{limiter, class}       failures by class (below)
//	throttle_backend_latency_seconds{limiter}   how long calls took, with WithLatency (below)
//	throttle_in_flight{limiter}                 units held by concurrency limits, not yet released
//	throttle_reloads_total{limiter}             configurations put in force (rules documents)
//	throttle_config_info{limiter, version}      1 for the version in force, the only series per limiter
//	throttle_limit{limiter}                     the limit an adaptive limiter set last (EventLimit)
//	throttle_retries_total{limiter, outcome}    failures a retry policy judged retryable, "retried" or "refused" (EventRetry)
//
// A limiter exports only the series its events can move: its decisions,
// errors and warnings from its first event; the others from the first
// event of their kind (the breaker's, a fallback, a timed call unless
// WithLatency, a unit held, a reload, a limit, a retry). A limiter
// without a breaker has no throttle_breaker_open, one that is never timed
// no latency histogram.
//
// An error's class tells the callers' mistakes from the backend's
// failures: "client" for an error wrapping throttle.ErrInvalid or
// ErrExceedsLimit (retrying cannot help), "backend" for
// throttle.ErrUnavailable, "other" for the rest (a closed limiter, a
// cancelled context). It counts failed calls (outcome "error"), each
// once. A call a failure policy decided is a decision and a fallback: a
// FailClosed refusal returns the backend's error (outcome "error",
// class "backend", and a "denied" fallback); a fail-open or fallback
// limiter's answer returns none (its outcome, and a fallback). The latency
// histogram gets the Event.Latency of each call that has one: with
// WithLatency, throttle.Observe times every call (use it on limiters
// backed by a store: Redis, PostgreSQL, the daemon); an EventLimit's, a
// window's mean, is not a call's. Its buckets run from 100µs to 2.5s
// unless WithLatencyBuckets says otherwise.
//
// Labels are the limiter's name and the outcome only: never the key, so
// the number of series stays that of the limiters. A call refused by a
// deny list (an error wrapping throttle.ErrDenied) counts as "denied".
package throttleprom

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/internal/obskit"
)

var (
	_ throttle.Observer                   = (*Observer)(nil)
	_ interface{ ObservesLatency() bool } = (*Observer)(nil)
	_ prometheus.Collector                = (*Observer)(nil)
)

// Option configures New.
type Option func(*config)

type config struct {
	namespace   string
	constLabels prometheus.Labels
	buckets     []float64
	timed       bool
}

// WithLatency makes the Observer ask for timed calls (see
// throttle.Observer): the limiters observed through throttle.Observe time
// each call, which fills the latency histogram at the cost of two clock
// reads per call.
func WithLatency() Option { return func(c *config) { c.timed = true } }

// defaultBuckets are backend round trips in seconds, 100µs to 2.5s.
var defaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// WithLatencyBuckets sets the upper bounds, in seconds, of the backend
// latency histogram's buckets (see prometheus.HistogramOpts).
func WithLatencyBuckets(b ...float64) Option {
	return func(c *config) { c.buckets = append([]float64(nil), b...) }
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
	errs      *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
	reloads   *prometheus.CounterVec
	version   *prometheus.GaugeVec
	limit     *prometheus.GaugeVec
	retries   *prometheus.CounterVec
	all       []prometheus.Collector // the above, for Describe and Collect
	timed     bool

	byName *obskit.Cache[*series]
}

// series are one limiter's metrics, resolved once; the lazy ones are
// made on their first use.
type series struct {
	count    [obskit.NumOutcomes]prometheus.Counter     // nil for the breaker outcomes
	class    [obskit.NumErrorClasses]prometheus.Counter // nil for NoError
	fallback [2]lazy[prometheus.Counter]                // allowed, denied
	breaker  lazy[prometheus.Gauge]
	latency  lazy[prometheus.Observer]
	inFlight lazy[prometheus.Gauge]
	reloads  lazy[prometheus.Counter]
	limit    lazy[prometheus.Gauge]
	retries  [2]lazy[prometheus.Counter] // refused, retried
}

// lazy is a series made by mk on its first use. Safe for concurrent use:
// racing first uses each call mk, which returns the same child of a vector.
type lazy[T any] struct {
	p  atomic.Pointer[T]
	mk func() T
}

func (l *lazy[T]) get() T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	v := l.mk()
	l.p.Store(&v)
	return v
}

func lazyOf[T any](mk func() T) lazy[T] { return lazy[T]{mk: mk} }

// New returns an Observer; register it with a prometheus.Registerer.
func New(opts ...Option) *Observer {
	c := config{namespace: "throttle", buckets: defaultBuckets}
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
		errs: prometheus.NewCounterVec(prometheus.CounterOpts(opt("errors_total",
			"Failed calls by class: client, backend or other.")),
			[]string{"limiter", "class"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts(opt("in_flight",
			"Units held by a concurrency limit and not yet released.")), []string{"limiter"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts(opt("reloads_total",
			"Configurations put in force (a rejected one is a warning).")), []string{"limiter"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts(opt("config_info",
			"1 for the version of the configuration in force.")), []string{"limiter", "version"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts(opt("limit",
			"The limit an adaptive limiter set last.")), []string{"limiter"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts(opt("retries_total",
			"Failures a retry policy judged retryable, by outcome: retried or refused.")), []string{"limiter", "outcome"}),
		timed: c.timed,
	}
	lat := opt("backend_latency_seconds", "How long calls to the limiter took, where they are timed: round trips to its backend.")
	o.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: lat.Namespace, Name: lat.Name,
		Help: lat.Help, ConstLabels: lat.ConstLabels, Buckets: c.buckets}, []string{"limiter"})
	o.all = []prometheus.Collector{o.decisions, o.fallbacks, o.breaker, o.warnings, o.errs, o.latency, o.inFlight, o.reloads, o.version, o.limit, o.retries}
	o.byName = obskit.NewCache(o.series)
	return o
}

// series returns the series of the limiter name.
func (o *Observer) series(name string) *series {
	s := &series{
		breaker:  lazyOf(func() prometheus.Gauge { return o.breaker.WithLabelValues(name) }),
		latency:  lazyOf(func() prometheus.Observer { return o.latency.WithLabelValues(name) }),
		inFlight: lazyOf(func() prometheus.Gauge { return o.inFlight.WithLabelValues(name) }),
		reloads:  lazyOf(func() prometheus.Counter { return o.reloads.WithLabelValues(name) }),
		limit:    lazyOf(func() prometheus.Gauge { return o.limit.WithLabelValues(name) }),
	}
	for i, out := range [2]string{"allowed", "denied"} {
		s.fallback[i] = lazyOf(func() prometheus.Counter { return o.fallbacks.WithLabelValues(name, out) })
	}
	for i, out := range [2]string{"refused", "retried"} {
		s.retries[i] = lazyOf(func() prometheus.Counter { return o.retries.WithLabelValues(name, out) })
	}
	s.count[obskit.Allowed] = o.decisions.WithLabelValues(name, "allowed")
	s.count[obskit.Denied] = o.decisions.WithLabelValues(name, "denied")
	s.count[obskit.Errored] = o.decisions.WithLabelValues(name, "error")
	s.count[obskit.Warning] = o.warnings.WithLabelValues(name)
	s.class[obskit.ClientError] = o.errs.WithLabelValues(name, "client")
	s.class[obskit.BackendError] = o.errs.WithLabelValues(name, "backend")
	s.class[obskit.OtherError] = o.errs.WithLabelValues(name, "other")
	if o.timed {
		s.latency.get()
	}
	return s
}

// Observe counts e.
func (o *Observer) Observe(e throttle.Event) {
	s := o.byName.Get(e.Limiter)
	switch out := obskit.Of(e); out {
	case obskit.None:
	case obskit.BreakerOpen:
		s.breaker.get().Set(1)
	case obskit.BreakerClosed:
		s.breaker.get().Set(0)
	case obskit.FallbackAllowed, obskit.FallbackDenied:
		s.fallback[out-obskit.FallbackAllowed].get().Inc()
		s.countClass(e)
	case obskit.Errored:
		s.count[out].Inc()
		s.countClass(e)
	default:
		s.count[out].Inc()
	}
	if e.Latency > 0 && e.Kind != throttle.EventLimit { // EventLimit's is a window's mean
		s.latency.get().Observe(e.Latency.Seconds())
	}
	switch {
	case e.Kind == throttle.EventReload:
		s.reloads.get().Inc()
		o.version.DeletePartialMatch(prometheus.Labels{"limiter": e.Limiter})
		o.version.WithLabelValues(e.Limiter, e.Key).Set(1)
	case e.Kind == throttle.EventRelease:
		s.inFlight.get().Sub(float64(e.N))
	case e.Kind == throttle.EventDecision && e.Held:
		s.inFlight.get().Add(float64(e.N))
	case e.Kind == throttle.EventLimit:
		s.limit.get().Set(float64(e.Decision.Limit))
	case e.Kind == throttle.EventRetry:
		s.retries[b2i(e.Decision.Allowed)].get().Inc()
	}
}

// countClass counts the failure of e by its class.
func (s *series) countClass(e throttle.Event) {
	if c := obskit.ClassOf(e); c != obskit.NoError {
		s.class[c].Inc()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ObservesLatency reports whether WithLatency was given.
func (o *Observer) ObservesLatency() bool { return o.timed }

// Describe sends the descriptors of the metrics.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.all {
		c.Describe(ch)
	}
}

// Collect sends the current values.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.all {
		c.Collect(ch)
	}
}
