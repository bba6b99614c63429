package envoyrls

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// domain loads the file's domain into the configuration.
func (p *fileParser) domain(root *yaml.Node) error {
	name, err := p.str(root, "domain")
	if err != nil {
		return err
	}
	if name == "" {
		return p.errorf(root.Line, "config file cannot have empty domain")
	}
	list, err := p.list(root, "descriptors")
	if err != nil {
		return err
	}
	d, present := p.cfg.domains[name]
	if present && !p.opts.MergeDomains {
		return p.errorf(field(root, "domain").Line, "duplicate domain '%s' in config file", name)
	}
	if !present {
		d = &descriptor{children: map[string]*descriptor{}}
	}
	if err := p.descriptors(d, name+".", list); err != nil {
		return err
	}
	p.cfg.domains[name] = d
	return nil
}

// descriptors loads the list of descriptors under parent, whose full key
// is prefix (ending in a dot).
func (p *fileParser) descriptors(parent *descriptor, prefix string, list []*yaml.Node) error {
	for _, m := range list {
		key, err := p.str(m, "key")
		if err != nil {
			return err
		}
		if key == "" {
			return p.errorf(m.Line, "descriptor has empty key")
		}
		value, err := p.str(m, "value")
		if err != nil {
			return err
		}
		final := key
		if value != "" {
			final += "_" + value
		}
		full := prefix + final
		if _, dup := parent.children[final]; dup {
			return p.errorf(m.Line, "duplicate descriptor composite key '%s'", full)
		}
		d, err := p.descriptor(m, final, full)
		if err != nil {
			return err
		}
		if strings.Contains(final, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: final, parts: strings.Split(final, "*")})
		}
		parent.children[final] = d
	}
	return nil
}

// descriptor loads one descriptor (the map m) and its children.
func (p *fileParser) descriptor(m *yaml.Node, final, full string) (*descriptor, error) {
	d := &descriptor{children: map[string]*descriptor{}}
	var flags [5]bool
	for i, k := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
		b, err := p.boolean(m, k)
		if err != nil {
			return nil, err
		}
		flags[i] = b
	}
	d.valueToMetric, d.shareThreshold = flags[3], flags[4]
	if rl := field(m, "rate_limit"); rl != nil && rl.Tag != "!!null" {
		if rl.Kind != yaml.MappingNode {
			return nil, p.errorf(rl.Line, "error loading config file: 'rate_limit' must be a map")
		}
		limit, err := p.rateLimit(rl, full)
		if err != nil {
			return nil, err
		}
		limit.ShadowMode, limit.QuotaMode, limit.DetailedMetric = flags[0], flags[1], flags[2]
		d.limit = limit
		p.cfg.rules++
	}
	if d.shareThreshold {
		if !strings.Contains(final, "*") {
			return nil, p.errorf(m.Line, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", final)
		}
		d.pattern = final
	}
	children, err := p.list(m, "descriptors")
	if err != nil {
		return nil, err
	}
	return d, p.descriptors(d, full+".", children)
}

// rateLimit loads a rate_limit map.
func (p *fileParser) rateLimit(rl *yaml.Node, full string) (*limitRule, error) {
	l := &limitRule{Key: full}
	var err error
	if l.RequestsPerUnit, err = p.uint32(rl, "requests_per_unit"); err != nil {
		return nil, err
	}
	if l.Unlimited, err = p.boolean(rl, "unlimited"); err != nil {
		return nil, err
	}
	if l.Name, err = p.str(rl, "name"); err != nil {
		return nil, err
	}
	unit, err := p.str(rl, "unit")
	if err != nil {
		return nil, err
	}
	l.rlUnit = unitNames[strings.ToUpper(unit)]
	switch {
	case l.Unlimited && l.rlUnit != unitUnknown:
		return nil, p.errorf(rl.Line, "should not specify rate limit unit when unlimited")
	case !l.Unlimited && l.rlUnit == unitUnknown:
		return nil, p.errorf(rl.Line, "invalid rate limit unit '%s'", unit)
	}
	if err := p.replaces(rl, l); err != nil {
		return nil, err
	}
	return l, p.algorithm(rl, l)
}

func (p *fileParser) replaces(rl *yaml.Node, l *limitRule) error {
	list, err := p.list(rl, "replaces")
	if err != nil {
		return err
	}
	for _, r := range list {
		name, err := p.str(r, "name")
		if err != nil {
			return err
		}
		if name == "" {
			return p.errorf(r.Line, "should not have an empty replaces entry")
		}
		if name == l.Name {
			return p.errorf(r.Line, "replaces should not contain name of same descriptor")
		}
		l.Replaces = append(l.Replaces, name)
	}
	return nil
}

// algorithm reads this package's own keys: algorithm and burst.
func (p *fileParser) algorithm(rl *yaml.Node, l *limitRule) error {
	name, err := p.str(rl, "algorithm")
	if err != nil {
		return err
	}
	if name != "" {
		a, ok := algorithmNames[strings.ToLower(name)]
		if !ok {
			return p.errorf(field(rl, "algorithm").Line, "unknown algorithm '%s' (fixed_window, token_bucket, sliding_window or sliding_log)", name)
		}
		l.algorithm = a
	}
	if l.Burst, err = p.uint32(rl, "burst"); err != nil {
		return err
	}
	if l.Burst != 0 && l.algorithm != tokenBucket {
		return p.errorf(field(rl, "burst").Line, "burst applies to the token_bucket algorithm only")
	}
	if !l.Unlimited && l.algorithm != fixedWindow && l.RequestsPerUnit == 0 {
		return p.errorf(rl.Line, "the %s algorithm needs requests_per_unit of 1 or more", l.algorithm)
	}
	return nil
}
