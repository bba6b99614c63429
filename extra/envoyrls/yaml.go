package envoyrls

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// knownKeys are the keys a configuration file may use, at any level, as
// the reference checks them; "algorithm" and "burst" are this package's.
var knownKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
	"algorithm": true, "burst": true,
}

// fileParser walks one file's YAML tree.
type fileParser struct {
	name string
	cfg  *Config
	opts LoadOptions
}

func (c *Config) load(f configFile, o LoadOptions) error {
	p := &fileParser{name: f.Name, cfg: c, opts: o}
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		return p.errorf(yamlLine(err.Error()), "error loading config file: %v", err)
	}
	root := &yaml.Node{Kind: yaml.MappingNode, Line: 1}
	if len(doc.Content) > 0 {
		root = resolve(doc.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		return p.errorf(root.Line, "error loading config file: the document is not a map")
	}
	if err := p.checkKeys(root); err != nil {
		return err
	}
	return p.domain(root)
}

func (p *fileParser) errorf(line int, format string, a ...any) error {
	return configError(p.name, line, format, a...)
}

// yamlLine finds "line N" in a YAML syntax error.
func yamlLine(msg string) int {
	_, after, ok := strings.Cut(msg, "line ")
	if !ok {
		return 0
	}
	end := strings.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(after)
	}
	n, _ := strconv.Atoi(after[:end])
	return n
}

func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// checkKeys refuses what the reference refuses anywhere in a file: a key
// that is not a string or not known, a list of something else than maps,
// a leaf that is not a string, an integer, a boolean or null.
func (p *fileParser) checkKeys(m *yaml.Node) error {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := resolve(m.Content[i]), resolve(m.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return p.errorf(k.Line, "config error, key is not of type string: %v", k.Value)
		}
		if !knownKeys[k.Value] {
			return p.errorf(k.Line, "config error, unknown key '%s'", k.Value)
		}
		if seen[k.Value] {
			return p.errorf(k.Line, "config error, key '%s' given twice", k.Value)
		}
		seen[k.Value] = true
		if k.Value == "metadata" {
			continue
		}
		if err := p.checkValue(v); err != nil {
			return err
		}
	}
	return nil
}

func (p *fileParser) checkValue(v *yaml.Node) error {
	switch v.Kind {
	case yaml.SequenceNode:
		for _, e := range v.Content {
			e = resolve(e)
			if e.Kind != yaml.MappingNode {
				return p.errorf(e.Line, "config error, yaml file contains list of type other than map: %v", e.Value)
			}
			if err := p.checkKeys(e); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		return p.checkKeys(v)
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!str", "!!int", "!!bool", "!!null":
		default:
			return p.errorf(v.Line, "error checking config: %s value %q", strings.TrimPrefix(v.Tag, "!!"), v.Value)
		}
	}
	return nil
}

// field returns the value of key in the mapping m, or nil.
func field(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return resolve(m.Content[i+1])
		}
	}
	return nil
}

func (p *fileParser) str(m *yaml.Node, key string) (string, error) {
	v := field(m, key)
	if v == nil || v.Tag == "!!null" {
		return "", nil
	}
	if v.Kind != yaml.ScalarNode {
		return "", p.errorf(v.Line, "error loading config file: '%s' must be a string", key)
	}
	return v.Value, nil
}

func (p *fileParser) boolean(m *yaml.Node, key string) (bool, error) {
	v := field(m, key)
	if v == nil || v.Tag == "!!null" {
		return false, nil
	}
	switch strings.ToLower(v.Value) {
	case "true", "yes", "on", "y":
		return v.Kind == yaml.ScalarNode, nil
	case "false", "no", "off", "n":
		return false, nil
	}
	return false, p.errorf(v.Line, "error loading config file: '%s' must be a boolean, not %q", key, v.Value)
}

func (p *fileParser) uint32(m *yaml.Node, key string) (uint32, error) {
	v := field(m, key)
	if v == nil || v.Tag == "!!null" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v.Value, 0, 32)
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil {
		return 0, p.errorf(v.Line, "error loading config file: '%s' must be an integer from 0 to 4294967295, not %q", key, v.Value)
	}
	return uint32(n), nil
}

func (p *fileParser) list(m *yaml.Node, key string) ([]*yaml.Node, error) {
	v := field(m, key)
	if v == nil || v.Tag == "!!null" {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, p.errorf(v.Line, "error loading config file: '%s' must be a list", key)
	}
	out := make([]*yaml.Node, len(v.Content))
	for i, e := range v.Content {
		out[i] = resolve(e)
	}
	return out, nil
}
