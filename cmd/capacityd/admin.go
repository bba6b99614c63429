package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"path"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/capacity"
	capacityv1 "github.com/throttlekit/throttle/distributed/capacity/gen/throttle/capacity/v1"
)

// adminHandler serves /healthz, /metrics and /status.
func (a *app) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.met.reg, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /status", a.status)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/status", http.StatusFound)
	})
	return mux
}

// healthz answers 200 while this server serves: as the master, or as a
// follower that knows the master to redirect to; 503 otherwise, and
// while its parent (in a server tree) refuses its requests. A parent that
// cannot be reached is reported with a 200: the server then hands out
// what its unexpired leases allow, and 0 once they have run out.
func (a *app) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	l := a.lead.Load()
	perr := a.srv.ParentErr()
	switch {
	case a.stopping.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "stopping")
	case l == nil || (!l.IsMaster && l.Master == ""):
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "no master known")
	case perr != nil && !errors.Is(perr, throttle.ErrUnavailable):
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "parent refuses:", perr)
	case perr != nil:
		fmt.Fprintln(w, "ok, parent unreachable:", perr)
	case l.IsMaster:
		fmt.Fprintf(w, "ok master %s term %d\n", a.advertise, l.Term)
	default:
		fmt.Fprintf(w, "ok follower of %s term %d\n", l.Master, l.Term)
	}
}

// metrics are the server's Prometheus metrics, in a registry of their
// own.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	reloads  *prometheus.CounterVec
	refused  *prometheus.CounterVec
	cut      prometheus.Counter     // gRPC connections closed for a late request
	answers  *prometheus.CounterVec // refused resources and stale calls
	// methods holds the series of the API's methods, looked up once: a
	// vector's lookup hashes and validates the label on every call. It
	// is not written after newMetrics.
	methods map[string]methodSeries
}

// methodSeries are the series of one method.
type methodSeries struct {
	latency  prometheus.Observer
	requests prometheus.Counter
}

func newMetrics(a *app) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capacityd_requests_total", Help: "API requests answered, by method.",
		}, []string{"method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capacityd_request_errors_total", Help: "API requests answered with an error, by method and code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "capacityd_request_duration_seconds", Help: "Time to answer an API request, by method.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"method"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capacityd_reloads_total", Help: "Configuration reloads, by result.",
		}, []string{"result"}),
	}
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capacityd_connections_refused_total", Help: "Connections closed at once because the port had its maximum open, by port (api, admin).",
	}, []string{"listener"})
	m.cut = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "capacityd_grpc_request_timeouts_total", Help: "Connections of the grpc_listen port closed because a call had not received its request within read_timeout.",
	})
	m.answers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capacityd_refusals_total", Help: "Resources of GetCapacity requests refused on their own (invalid_argument, resource_exhausted), and requests ignored as older than one applied for their client (stale).",
	}, []string{"reason"})
	for _, r := range []string{"applied", "refused"} {
		m.reloads.WithLabelValues(r)
	}
	m.methods = map[string]methodSeries{}
	for _, d := range grpcDesc.Methods {
		name := d.MethodName
		m.methods[name] = methodSeries{m.latency.WithLabelValues(name), m.requests.WithLabelValues(name)}
	}
	m.reg.MustRegister(m.requests, m.errors, m.latency, m.reloads, m.refused, m.cut, m.answers, statusCollector{a},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// interceptor counts and times the API's requests.
func (m *metrics) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			t0 := time.Now()
			resp, err := next(ctx, req)
			var msg any
			if err == nil && resp != nil {
				msg = resp.Any()
			}
			m.observe(path.Base(req.Spec().Procedure), t0, msg, err)
			return resp, err
		}
	})
}

// observe counts and times a request of method that started at t0, and
// the refusals in its answer msg.
func (m *metrics) observe(method string, t0 time.Time, msg any, err error) {
	ms, ok := m.methods[method]
	if !ok {
		ms = methodSeries{m.latency.WithLabelValues(method), m.requests.WithLabelValues(method)}
	}
	ms.latency.Observe(time.Since(t0).Seconds())
	ms.requests.Inc()
	if err != nil {
		m.errors.WithLabelValues(method, connect.CodeOf(err).String()).Inc()
	}
	if r, ok := msg.(*capacityv1.GetCapacityResponse); ok {
		m.countRefusals(r)
	}
}

// countRefusals counts the resources a GetCapacity answer refused, and a
// stale answer.
func (m *metrics) countRefusals(r *capacityv1.GetCapacityResponse) {
	if r.GetStale() {
		m.answers.WithLabelValues("stale").Inc()
	}
	for _, g := range r.GetGrants() {
		switch g.GetCode() {
		case capacityv1.ResourceCode_RESOURCE_CODE_OK:
		case capacityv1.ResourceCode_RESOURCE_CODE_RESOURCE_EXHAUSTED:
			m.answers.WithLabelValues("resource_exhausted").Inc()
		default:
			m.answers.WithLabelValues("invalid_argument").Inc()
		}
	}
}

// Resource series are labelled only with ids the operator configured:
// a resource's own series exist for ids that are a template's exact id;
// every resource, made-up ids included, is counted in the series of its
// template. The number of series is thus bounded by the configuration,
// whatever ids clients send.
var (
	descCapacity = prometheus.NewDesc("capacityd_resource_capacity", "Configured capacity of the resource (resources configured by exact id).", []string{"resource"}, nil)
	descGranted  = prometheus.NewDesc("capacityd_resource_granted", "What the resource's clients may hold: unexpired leases, lowered ones at their old size until confirmed, and what clients report holding beyond them (resources configured by exact id).", []string{"resource"}, nil)
	descWants    = prometheus.NewDesc("capacityd_resource_wants", "Sum of what the resource's clients want (resources configured by exact id).", []string{"resource"}, nil)
	descClients  = prometheus.NewDesc("capacityd_resource_clients", "Clients with an unexpired lease or demand on the resource (resources configured by exact id).", []string{"resource"}, nil)
	descLearning = prometheus.NewDesc("capacityd_resource_learning", "1 while the server learns what the resource's clients hold after becoming master (resources configured by exact id).", []string{"resource"}, nil)
	descTmplRes  = prometheus.NewDesc("capacityd_template_resources", "Resources the server tracks whose configuration is the template.", []string{"template"}, nil)
	descTmplHeld = prometheus.NewDesc("capacityd_template_granted", "What the clients of the template's resources may hold: unexpired leases, lowered ones at their old size until confirmed, and what clients report holding beyond them.", []string{"template"}, nil)
	descTmplWant = prometheus.NewDesc("capacityd_template_wants", "Sum of what clients want of the template's resources.", []string{"template"}, nil)
	descTmplCli  = prometheus.NewDesc("capacityd_template_clients", "Client leases or demands on the template's resources.", []string{"template"}, nil)
	descMaster   = prometheus.NewDesc("capacityd_master", "1 while this server is the master.", nil, nil)
	descTerm     = prometheus.NewDesc("capacityd_term", "Election term of the current master (0 while unknown).", nil, nil)
)

// statusCollector reports the resources of the server's status at each
// scrape.
type statusCollector struct{ a *app }

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descGranted, descWants, descClients, descLearning,
		descTmplRes, descTmplHeld, descTmplWant, descTmplCli, descMaster, descTerm} {
		ch <- d
	}
}

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.srv.Status()
	type sums struct{ n, held, wants, clients float64 }
	tmpl := map[string]*sums{}
	for _, t := range c.a.cur.Load().resources.Resources {
		tmpl[t.ID] = new(sums)
	}
	for _, r := range st.Resources {
		if t := tmpl[r.Template]; t != nil { // nil only during a reload
			t.n++
			t.held += r.Held
			t.wants += r.Wants
			t.clients += float64(r.Clients)
		}
		if r.ID != r.Template {
			continue // a client-chosen id: no series of its own
		}
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, r.Capacity, r.ID)
		ch <- prometheus.MustNewConstMetric(descGranted, prometheus.GaugeValue, r.Held, r.ID)
		ch <- prometheus.MustNewConstMetric(descWants, prometheus.GaugeValue, r.Wants, r.ID)
		ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(r.Clients), r.ID)
		ch <- prometheus.MustNewConstMetric(descLearning, prometheus.GaugeValue, b2f(r.Learning), r.ID)
	}
	for id, t := range tmpl {
		ch <- prometheus.MustNewConstMetric(descTmplRes, prometheus.GaugeValue, t.n, id)
		ch <- prometheus.MustNewConstMetric(descTmplHeld, prometheus.GaugeValue, t.held, id)
		ch <- prometheus.MustNewConstMetric(descTmplWant, prometheus.GaugeValue, t.wants, id)
		ch <- prometheus.MustNewConstMetric(descTmplCli, prometheus.GaugeValue, t.clients, id)
	}
	ch <- prometheus.MustNewConstMetric(descMaster, prometheus.GaugeValue, b2f(st.Leadership.IsMaster))
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(st.Leadership.Term))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Bounds of the status page.
const (
	statusMaxResources = 500
	statusMaxClients   = 100
)

//go:embed status.html
var statusHTML string

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur": func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() },
}).Parse(statusHTML))

type statusPage struct {
	Advertise  string
	Leadership capacity.Leadership
	Templates  []capacity.Template
	Resources  []statusResource
	Total      int // resources in all
}

type statusResource struct {
	capacity.ResourceStatus
	Clients []capacity.ClientStatus
	More    int // clients not listed
}

// status serves an HTML page of the resources, their clients and leases.
func (a *app) status(w http.ResponseWriter, _ *http.Request) {
	st := a.srv.Status()
	p := statusPage{Advertise: a.advertise, Leadership: st.Leadership, Templates: a.cur.Load().resources.Resources, Total: len(st.Resources)}
	for i, r := range st.Resources {
		if i == statusMaxResources {
			break
		}
		cs, n := a.srv.Clients(r.ID, statusMaxClients)
		p.Resources = append(p.Resources, statusResource{ResourceStatus: r, Clients: cs, More: n - len(cs)})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := statusTmpl.Execute(w, p); err != nil {
		a.log.Debug("status page", "err", err)
	}
}
