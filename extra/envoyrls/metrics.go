package envoyrls

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// otherKey collects the hits of rule keys past the series cap.
const otherKey = "_other"

// ruleStats are one rule key's counters (hits, as the reference counts).
type ruleStats struct {
	total, over, near, within, shadow atomic.Uint64
}

// metrics are the service's counters: per rule key, at most max keys
// (then "_other"), so that detailed_metric or value_to_metric cannot
// grow the series without bound. Safe for concurrent use.
type metrics struct {
	rules         sync.Map // key → *ruleStats
	n             atomic.Int64
	max           int64
	ratio         float64
	other         ruleStats
	backendErrors atomic.Uint64
	globalShadows atomic.Uint64
}

func newMetrics(max int, ratio float64) *metrics {
	return &metrics{max: int64(max), ratio: ratio}
}

func (m *metrics) stats(key string) *ruleStats {
	if v, ok := m.rules.Load(key); ok {
		return v.(*ruleStats)
	}
	if m.n.Add(1) > m.max {
		m.n.Add(-1)
		return &m.other
	}
	v, loaded := m.rules.LoadOrStore(key, &ruleStats{})
	if loaded {
		m.n.Add(-1)
	}
	return v.(*ruleStats)
}

func (m *metrics) backendError() { m.backendErrors.Add(1) }
func (m *metrics) globalShadow() { m.globalShadows.Add(1) }

// record counts n hits of a descriptor under key, split as the
// reference splits them: the hits past the limit are over it (and
// shadowed in shadow mode), those past the near-limit threshold near it.
func (m *metrics) record(key string, l *limitRule, n uint64, o outcome) {
	s := m.stats(key)
	s.total.Add(n)
	limit := uint64(l.RequestsPerUnit)
	nearAt := uint64(math.Floor(float64(limit) * m.ratio))
	if l.algorithm != fixedWindow {
		switch {
		case o.Over:
			s.over.Add(n)
		case uint64(o.Remaining) < limit-nearAt:
			s.near.Add(n)
			s.within.Add(n)
		default:
			s.within.Add(n)
		}
		if o.Over && l.ShadowMode {
			s.shadow.Add(n)
		}
		return
	}
	before, after := o.Before, o.After
	if after > limit {
		pastLimit := n
		if before < limit {
			pastLimit = after - limit
			s.near.Add(limit - max(nearAt, before))
		}
		s.over.Add(pastLimit)
		if l.ShadowMode {
			s.shadow.Add(pastLimit)
		}
		return
	}
	s.within.Add(n)
	if after > nearAt {
		s.near.Add(min(n, after-nearAt))
	}
}

// writeMetrics writes the service's counters in the Prometheus text
// format (version 0.0.4): per rule key, the hits, those over the limit,
// near it, within it, and over it in shadow mode; backend errors; and
// the requests the global shadow mode let through.
func (s *Service) writeMetrics(w io.Writer) error {
	m := s.metrics
	type row struct {
		key string
		st  *ruleStats
	}
	var rows []row
	m.rules.Range(func(k, v any) bool { rows = append(rows, row{k.(string), v.(*ruleStats)}); return true })
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.key, b.key) })
	rows = append(rows, row{otherKey, &m.other})
	b := bufio.NewWriter(w)
	for _, c := range []struct {
		name, help string
		get        func(*ruleStats) uint64
	}{
		{"envoyrls_hits_total", "Hits asked for, per rule key.", func(r *ruleStats) uint64 { return r.total.Load() }},
		{"envoyrls_over_limit_total", "Hits over the limit, per rule key.", func(r *ruleStats) uint64 { return r.over.Load() }},
		{"envoyrls_near_limit_total", "Hits past the near-limit ratio of the limit, per rule key.", func(r *ruleStats) uint64 { return r.near.Load() }},
		{"envoyrls_within_limit_total", "Hits within the limit, per rule key.", func(r *ruleStats) uint64 { return r.within.Load() }},
		{"envoyrls_shadow_mode_total", "Hits over the limit let through by the rule's shadow mode, per rule key.", func(r *ruleStats) uint64 { return r.shadow.Load() }},
	} {
		b.WriteString("# HELP " + c.name + " " + c.help + "\n# TYPE " + c.name + " counter\n")
		for _, r := range rows {
			b.WriteString(c.name + `{key="` + escapeLabel(r.key) + `"} ` + strconv.FormatUint(c.get(r.st), 10) + "\n")
		}
	}
	b.WriteString("# HELP envoyrls_backend_errors_total Requests failed by the backend.\n# TYPE envoyrls_backend_errors_total counter\n")
	b.WriteString("envoyrls_backend_errors_total " + strconv.FormatUint(m.backendErrors.Load(), 10) + "\n")
	b.WriteString("# HELP envoyrls_global_shadow_mode_total Requests over a limit answered OK by the global shadow mode.\n# TYPE envoyrls_global_shadow_mode_total counter\n")
	b.WriteString("envoyrls_global_shadow_mode_total " + strconv.FormatUint(m.globalShadows.Load(), 10) + "\n")
	return b.Flush()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
