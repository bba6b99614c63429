package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/throttlekit/throttle"
)

// maxConfigSize bounds the size of a rules document in bytes.
const maxConfigSize = 4 << 20

// maxDepth bounds the nesting of a rules document; the format needs 4.
const maxDepth = 16

// Limit is one limit: a token bucket (Rate and Burst) or a window (Count
// units per Window). Exactly one of the two forms is set.
type Limit struct {
	Rate  throttle.Rate // units refilled per period (bucket form)
	Burst int           // bucket capacity (bucket form)

	Count  int           // units admitted per window (window form)
	Window time.Duration // window length (window form)
}

// isWindow reports whether l is in window form.
func (l Limit) isWindow() bool { return l.Window > 0 }

// Quota states l as units per window: a bucket of burst b refilling at r
// is b units per b/r.
func (l Limit) Quota() throttle.Quota {
	if l.isWindow() {
		return throttle.Quota{Limit: l.Count, Window: l.Window}
	}
	return throttle.Quota{Limit: l.Burst, Window: l.Rate.Duration(int64(l.Burst))}
}

// String returns the limit as the document writes it.
func (l Limit) String() string {
	if l.isWindow() {
		return fmt.Sprintf("%d per %v", l.Count, l.Window)
	}
	return fmt.Sprintf("%v burst %d", l.Rate, l.Burst)
}

// Config is a parsed, validated rules document. Build one with Parse or
// ParseFile; hand it to New or Limiter.Update.
type Config struct {
	def   spec
	tiers map[string]Limit // by name; tier order in tierNames
	names []string
	rules []ruleSpec
	allow []matcher
	deny  []matcher
}

// spec is a limit or a reference to a tier.
type spec struct {
	lim  Limit
	tier string // when set, lim is unused
}

type ruleSpec struct {
	m    matcher
	spec spec
}

// The JSON shapes. Field names are matched as encoding/json does; unknown
// fields and repeated names are rejected before decoding.
type (
	jsonDoc struct {
		Default *jsonLimit           `json:"default"`
		Tiers   map[string]jsonLimit `json:"tiers"`
		Rules   []jsonRule           `json:"rules"`
		Allow   *jsonList            `json:"allow"`
		Deny    *jsonList            `json:"deny"`
	}
	jsonLimit struct {
		Rate   string `json:"rate"`
		Burst  *int   `json:"burst"`
		Limit  *int   `json:"limit"`
		Window string `json:"window"`
		Tier   string `json:"tier"`
	}
	jsonRule struct {
		Key     *string `json:"key"`
		Prefix  *string `json:"prefix"`
		Pattern *string `json:"pattern"`
		jsonLimit
	}
	jsonList struct {
		Keys     []string `json:"keys"`
		Prefixes []string `json:"prefixes"`
		Patterns []string `json:"patterns"`
	}
)

// Parse parses and validates a rules document (see the package
// documentation for the format). It is strict: unknown fields, a field or
// tier given twice, the same key, prefix or pattern given twice, a rule
// with no limit or two, a bad rate, burst, limit or window, a reference to
// an unknown tier and trailing data are all errors wrapping
// throttle.ErrInvalid.
func Parse(data []byte) (*Config, error) {
	if len(data) > maxConfigSize {
		return nil, invalid("document of %d bytes is larger than %d", len(data), maxConfigSize)
	}
	if !utf8.Valid(data) {
		// encoding/json would turn each bad byte into U+FFFD: a key on the
		// deny list would silently become another.
		return nil, invalid("document is not valid UTF-8 (at byte %d)", invalidAt(data))
	}
	if err := checkDuplicates(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc jsonDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, invalid("%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalid("data after the document")
	}
	return doc.build()
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: rules: %s", throttle.ErrInvalid, fmt.Sprintf(format, args...))
}

func (doc *jsonDoc) build() (*Config, error) {
	c := &Config{tiers: make(map[string]Limit, len(doc.Tiers))}
	for name, jl := range doc.Tiers {
		if name == "" {
			return nil, invalid("tiers: empty tier name")
		}
		if jl.Tier != "" {
			return nil, invalid("tier %q: a tier cannot refer to another tier", name)
		}
		s, err := jl.spec("tier " + quote(name))
		if err != nil {
			return nil, err
		}
		c.tiers[name] = s.lim
		c.names = append(c.names, name)
	}
	sortStrings(c.names)
	if doc.Default == nil {
		return nil, invalid(`"default" is missing: say what a key no rule matches gets`)
	}
	var err error
	if c.def, err = doc.Default.spec("default"); err != nil {
		return nil, err
	}
	if err := c.checkTier("default", c.def); err != nil {
		return nil, err
	}
	seen := map[matcher]string{}
	for i, jr := range doc.Rules {
		where := fmt.Sprintf("rules[%d]", i)
		m, err := jr.matcher(where)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[m]; dup {
			return nil, invalid("%s: %s is already matched by %s", where, m, prev)
		}
		seen[m] = where
		where += " (" + m.String() + ")"
		s, err := jr.spec(where)
		if err != nil {
			return nil, err
		}
		if err := c.checkTier(where, s); err != nil {
			return nil, err
		}
		c.rules = append(c.rules, ruleSpec{m: m, spec: s})
	}
	lists := map[matcher]string{}
	if c.allow, err = doc.Allow.matchers("allow", lists); err != nil {
		return nil, err
	}
	if c.deny, err = doc.Deny.matchers("deny", lists); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) checkTier(where string, s spec) error {
	if s.tier == "" {
		return nil
	}
	if _, ok := c.tiers[s.tier]; !ok {
		return invalid("%s: unknown tier %q", where, s.tier)
	}
	return nil
}

func (jl *jsonLimit) spec(where string) (spec, error) {
	bucket := jl.Rate != "" || jl.Burst != nil
	window := jl.Window != "" || jl.Limit != nil
	forms := 0
	for _, f := range []bool{bucket, window, jl.Tier != ""} {
		if f {
			forms++
		}
	}
	if forms != 1 {
		return spec{}, invalid(`%s: give exactly one of "rate" and "burst", "limit" and "window", or "tier"`, where)
	}
	switch {
	case jl.Tier != "":
		return spec{tier: jl.Tier}, nil
	case bucket:
		if jl.Rate == "" || jl.Burst == nil {
			return spec{}, invalid(`%s: a bucket needs both "rate" and "burst"`, where)
		}
		r, err := throttle.ParseRate(jl.Rate)
		if err != nil {
			return spec{}, fmt.Errorf("rules: %s: %w", where, err)
		}
		if *jl.Burst <= 0 {
			return spec{}, invalid("%s: burst %d must be positive", where, *jl.Burst)
		}
		return spec{lim: Limit{Rate: r, Burst: *jl.Burst}}, nil
	default:
		if jl.Window == "" || jl.Limit == nil {
			return spec{}, invalid(`%s: a window needs both "limit" and "window"`, where)
		}
		w, err := time.ParseDuration(jl.Window)
		if err != nil || w <= 0 {
			return spec{}, invalid("%s: window %q must be a positive duration such as 1m", where, jl.Window)
		}
		if *jl.Limit <= 0 {
			return spec{}, invalid("%s: limit %d must be positive", where, *jl.Limit)
		}
		return spec{lim: Limit{Count: *jl.Limit, Window: w}}, nil
	}
}

func (jr *jsonRule) matcher(where string) (matcher, error) {
	var m matcher
	n := 0
	if jr.Key != nil {
		m, n = matcher{kind: kindExact, s: *jr.Key}, n+1
	}
	if jr.Prefix != nil {
		m, n = matcher{kind: kindPrefix, s: *jr.Prefix}, n+1
	}
	if jr.Pattern != nil {
		m, n = matcher{kind: kindPattern, s: *jr.Pattern}, n+1
	}
	if n != 1 {
		return m, invalid(`%s: give exactly one of "key", "prefix" and "pattern"`, where)
	}
	return m, m.validate(where)
}

func (jl *jsonList) matchers(where string, seen map[matcher]string) ([]matcher, error) {
	if jl == nil {
		return nil, nil
	}
	var out []matcher
	add := func(k kind, field string, ss []string) error {
		for i, s := range ss {
			m := matcher{kind: k, s: s}
			at := fmt.Sprintf("%s.%s[%d]", where, field, i)
			if err := m.validate(at); err != nil {
				return err
			}
			if prev, dup := seen[m]; dup {
				return invalid("%s: %s is already listed in %s", at, m, prev)
			}
			seen[m] = at
			out = append(out, m)
		}
		return nil
	}
	if err := add(kindExact, "keys", jl.Keys); err != nil {
		return nil, err
	}
	if err := add(kindPrefix, "prefixes", jl.Prefixes); err != nil {
		return nil, err
	}
	if err := add(kindPattern, "patterns", jl.Patterns); err != nil {
		return nil, err
	}
	return out, nil
}

// invalidAt returns the offset of the first byte of data that is not
// valid UTF-8.
func invalidAt(data []byte) int {
	for i := 0; i < len(data); {
		r, w := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && w == 1 {
			return i
		}
		i += w
	}
	return len(data)
}

// checkDuplicates rejects an object that names a field twice (compared
// without case, as encoding/json matches field names; the names of the
// tiers, a map's keys, exactly) and nesting deeper than the format has:
// encoding/json would silently keep the last value.
func checkDuplicates(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := walk(dec, "", 0); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return invalid("bad JSON: %v", err)
		}
		return err
	}
	return nil
}

func walk(dec *json.Decoder, path string, depth int) error {
	if depth > maxDepth {
		return invalid("%s: nested deeper than %d levels", orRoot(path), maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		exact := strings.EqualFold(path, ".tiers") // a map: its keys are data, not field names
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := kt.(string)
			name := k
			if !exact {
				name = strings.ToLower(k)
			}
			if seen[name] {
				return invalid("%s: %q given twice", orRoot(path), k)
			}
			seen[name] = true
			if err := walk(dec, path+"."+k, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walk(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return nil
}

func orRoot(path string) string {
	if path == "" {
		return "document"
	}
	return path[1:]
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
