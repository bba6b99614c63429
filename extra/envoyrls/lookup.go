package envoyrls

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// match is the rule a descriptor resolved to.
type match struct {
	limit *limitRule
	// share holds, per entry of the descriptor, the wildcard value its
	// count is shared under (share_threshold), or "" to count under the
	// entry's own value; nil when no entry shares.
	share []string
	// metric is the key the descriptor's hits are reported under.
	metric string
}

// wildcardMatch reports whether value matches the pattern split on '*':
// each '*' stands for any run of bytes, possibly empty.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// step finds the child of d that entry selects: key_value exactly, else
// the first wildcard matching key_value, else key alone.
func (d *descriptor) step(e *rlv3.RateLimitDescriptor_Entry) (next *descriptor, viaWildcard string, byValue bool) {
	kv := e.Key + "_" + e.Value
	if next = d.children[kv]; next != nil {
		return next, "", true
	}
	for _, w := range d.wildcards {
		if wildcardMatch(w.parts, kv) {
			if next = d.children[w.key]; next != nil {
				return next, w.key, true
			}
		}
	}
	return d.children[e.Key], "", false
}

// lookup resolves a descriptor of domain to its rule, as the reference
// does: the rule applies only when the descriptor's last entry reaches
// a level with a rate_limit; a level without children ends the walk.
func (c *Config) lookup(domain string, entries []*rlv3.RateLimitDescriptor_Entry) (m match, ok bool) {
	d := c.domains[domain]
	if d == nil {
		return m, false
	}
	var share []string
	var metric strings.Builder
	metric.WriteString(domain)
	for i, e := range entries {
		next, wild, byValue := d.step(e)
		if wild != "" && next.shareThreshold {
			if share == nil {
				share = make([]string, len(entries))
			}
			share[i] = strings.TrimPrefix(next.pattern, e.Key+"_")
		}
		writeMetricEntry(&metric, e, next, wild, byValue, share, i)
		if next != nil && next.limit != nil && i == len(entries)-1 {
			m.limit = next.limit
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		d = next
	}
	if m.limit == nil {
		return m, false
	}
	m.share = share
	m.metric = m.limit.Key
	if m.limit.DetailedMetric {
		m.metric = detailedKey(domain, entries, share)
	} else if k := metric.String(); k != m.limit.Key {
		m.metric = k
	}
	return m, true
}

// writeMetricEntry appends one entry to the value_to_metric key: the
// value the rule was matched by, the runtime value for value_to_metric,
// the wildcard pattern otherwise.
func writeMetricEntry(b *strings.Builder, e *rlv3.RateLimitDescriptor_Entry, next *descriptor, wild string, byValue bool, share []string, i int) {
	b.WriteByte('.')
	b.WriteString(e.Key)
	if next == nil {
		return
	}
	v := ""
	switch {
	case wild != "" && share != nil && share[i] != "":
		v = share[i]
	case wild != "" && next.valueToMetric:
		v = e.Value
	case wild != "":
		v = strings.TrimPrefix(wild, e.Key+"_")
	case byValue || next.valueToMetric:
		v = e.Value
	}
	if v != "" {
		b.WriteByte('_')
		b.WriteString(v)
	}
}

// detailedKey is the detailed_metric key: every entry with its value (or
// its shared wildcard pattern).
func detailedKey(domain string, entries []*rlv3.RateLimitDescriptor_Entry, share []string) string {
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		v := e.Value
		if share != nil && share[i] != "" {
			v = share[i]
		}
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// counterKey is the key a descriptor's hits are counted under, the
// reference's Redis key without its window: prefix, domain, then each
// entry's key and value (or shared pattern), each followed by '_'.
func counterKey(prefix, domain string, entries []*rlv3.RateLimitDescriptor_Entry, share []string) string {
	n := len(prefix) + len(domain) + 1
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	var b strings.Builder
	b.Grow(n + 12)
	b.WriteString(prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('_')
		if share != nil && i < len(share) && share[i] != "" {
			b.WriteString(share[i])
		} else {
			b.WriteString(e.Value)
		}
		b.WriteByte('_')
	}
	return b.String()
}
