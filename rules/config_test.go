package rules_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
)

const sample = `{
  "default": {"rate": "10/s", "burst": 20},
  "tiers": {
    "free": {"rate": "1/s", "burst": 5},
    "pro":  {"limit": 10000, "window": "1h"}
  },
  "rules": [
    {"key": "acme", "tier": "pro"},
    {"prefix": "internal:", "rate": "1000/s", "burst": 1000},
    {"prefix": "internal:batch:", "rate": "1/m", "burst": 1},
    {"pattern": "batch-*-nightly", "limit": 5, "window": "1m"}
  ],
  "allow": {"keys": ["healthcheck"], "prefixes": ["ops:"]},
  "deny":  {"keys": ["abuser"], "patterns": ["scraper-?-*"]}
}`

func TestParseSample(t *testing.T) {
	if _, err := rules.Parse([]byte(sample)); err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Parse([]byte(`{"default": {"tier": "t"}, "tiers": {"t": {"rate": "1/6s", "burst": 1}}}`)); err != nil {
		t.Fatal(err)
	}
}

func TestParseRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":              ``,
		"not an object":      `[]`,
		"no default":         `{}`,
		"unknown field":      `{"default": {"rate": "1/s", "burst": 1}, "defualt": 1}`,
		"unknown limit key":  `{"default": {"rate": "1/s", "burst": 1, "brust": 2}}`,
		"field twice":        `{"default": {"rate": "1/s", "burst": 1, "burst": 2}}`,
		"field twice case":   `{"default": {"rate": "1/s", "burst": 1, "Burst": 2}}`,
		"default twice":      `{"default": {"rate": "1/s", "burst": 1}, "default": {"rate": "2/s", "burst": 1}}`,
		"tier twice":         `{"default": {"rate": "1/s", "burst": 1}, "tiers": {"a": {"rate": "1/s", "burst": 1}, "a": {"rate": "2/s", "burst": 1}}}`,
		"key twice":          `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "a", "rate": "1/s", "burst": 1}, {"key": "a", "rate": "2/s", "burst": 1}]}`,
		"prefix twice":       `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"prefix": "a", "rate": "1/s", "burst": 1}, {"prefix": "a", "rate": "2/s", "burst": 1}]}`,
		"pattern twice":      `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"pattern": "a*", "rate": "1/s", "burst": 1}, {"pattern": "a*", "rate": "2/s", "burst": 1}]}`,
		"allow and deny":     `{"default": {"rate": "1/s", "burst": 1}, "allow": {"keys": ["a"]}, "deny": {"keys": ["a"]}}`,
		"allow twice":        `{"default": {"rate": "1/s", "burst": 1}, "allow": {"keys": ["a", "a"]}}`,
		"bad rate":           `{"default": {"rate": "fast", "burst": 1}}`,
		"zero rate":          `{"default": {"rate": "0/s", "burst": 1}}`,
		"rate too high":      `{"default": {"rate": "2000000000/s", "burst": 1}}`,
		"zero burst":         `{"default": {"rate": "1/s", "burst": 0}}`,
		"negative burst":     `{"default": {"rate": "1/s", "burst": -1}}`,
		"fractional burst":   `{"default": {"rate": "1/s", "burst": 1.5}}`,
		"rate no burst":      `{"default": {"rate": "1/s"}}`,
		"burst no rate":      `{"default": {"burst": 1}}`,
		"two forms":          `{"default": {"rate": "1/s", "burst": 1, "limit": 3, "window": "1s"}}`,
		"no form":            `{"default": {}}`,
		"zero window":        `{"default": {"limit": 3, "window": "0s"}}`,
		"bad window":         `{"default": {"limit": 3, "window": "soon"}}`,
		"zero limit":         `{"default": {"limit": 0, "window": "1s"}}`,
		"unknown tier":       `{"default": {"tier": "gold"}}`,
		"tier to tier":       `{"default": {"rate": "1/s", "burst": 1}, "tiers": {"a": {"tier": "a"}}}`,
		"empty tier name":    `{"default": {"rate": "1/s", "burst": 1}, "tiers": {"": {"rate": "1/s", "burst": 1}}}`,
		"rule without match": `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"rate": "1/s", "burst": 1}]}`,
		"rule two matches":   `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "a", "prefix": "a", "rate": "1/s", "burst": 1}]}`,
		"empty key":          `{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "", "rate": "1/s", "burst": 1}]}`,
		"empty prefix":       `{"default": {"rate": "1/s", "burst": 1}, "deny": {"prefixes": [""]}}`,
		"huge key":           `{"default": {"rate": "1/s", "burst": 1}, "allow": {"keys": ["` + strings.Repeat("k", rules.MaxPatternLen+1) + `"]}}`,
		"trailing data":      `{"default": {"rate": "1/s", "burst": 1}} {}`,
		"truncated":          `{"default": {"rate": "1/s", "burst": 1}`,
		"too deep":           `{"default": {"rate": "1/s", "burst": 1}, "x": ` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		"invalid UTF-8 key":  `{"default": {"rate": "1/s", "burst": 1}, "deny": {"keys": ["a` + "\xff" + `b"]}}`,
		"invalid UTF-8 tier": `{"default": {"rate": "1/s", "burst": 1}, "tiers": {"` + "\xc3" + `": {"rate": "1/s", "burst": 1}}}`,
	} {
		_, err := rules.Parse([]byte(doc))
		if !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := rules.Parse([]byte(strings.Repeat(" ", rules.MaxConfigSize+1))); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("oversized: %v", err)
	}
}

// Tier names are map keys, compared exactly: "Pro" and "pro" are two
// tiers (field names are matched without case, as encoding/json does).
func TestParseTierNamesAreCaseSensitive(t *testing.T) {
	c, err := rules.Parse([]byte(`{"default": {"tier": "pro"}, "tiers": {"Pro": {"rate": "1/s", "burst": 1}, "pro": {"rate": "2/s", "burst": 2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	l, err := rules.New(c, rules.WithTierMap(map[string]string{"a": "Pro"}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for key, burst := range map[string]int{"a": 1, "b": 2} {
		if m, err := l.Lookup(key); err != nil || m.Limit.Burst != burst {
			t.Errorf("%s: %+v, %v; want burst %d", key, m, err, burst)
		}
	}
}

func TestParseErrorsSayWhere(t *testing.T) {
	for doc, want := range map[string]string{
		`{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "a", "rate": "ten/s", "burst": 1}]}`:                                        `rules[0] (key "a")`,
		`{"default": {"rate": "1/s", "burst": 1}, "rules": [{"key": "a", "rate": "1/s", "burst": 1}, {"key": "a", "rate": "1/s", "burst": 1}]}`: `rules[1]: key "a" is already matched by rules[0]`,
		`{"default": {"rate": "1/s", "burst": 1, "burst": 2}}`:                                                                                  `default: "burst" given twice`,
	} {
		_, err := rules.Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %q", err, want)
		}
	}
}

func TestLimitQuota(t *testing.T) {
	q := rules.Limit{Rate: throttle.PerSecond(10), Burst: 20}.Quota()
	if q.Limit != 20 || q.Window != 2*time.Second {
		t.Errorf("bucket quota = %+v", q)
	}
	q = rules.Limit{Count: 5, Window: time.Minute}.Quota()
	if q.Limit != 5 || q.Window != time.Minute {
		t.Errorf("window quota = %+v", q)
	}
}
