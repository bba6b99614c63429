package rules_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
)

// globRegexp is the reference: the pattern turned into an anchored
// regular expression.
func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`(?s)^`)
	for _, r := range pattern {
		switch r {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`$`)
	return regexp.MustCompile(b.String())
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		p, k string
		want bool
	}{
		{"", "", true}, {"", "a", false}, {"*", "", true}, {"*", "anything", true},
		{"a*b", "ab", true}, {"a*b", "axxb", true}, {"a*b", "axxbc", false},
		{"a?c", "abc", true}, {"a?c", "ac", false}, {"a?c", "aéc", true},
		{"*a*a*", "aa", true}, {"*a*a*", "a", false}, {"**", "x", true},
		{"?", "é", true}, {"??", "é", false}, {"x*?", "xé", true},
	} {
		if got := rules.Glob(c.p, c.k); got != c.want {
			t.Errorf("Glob(%q, %q) = %v", c.p, c.k, got)
		}
	}
}

// FuzzGlob checks Glob against the regular-expression reference on valid
// UTF-8, and that it never panics on anything.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{{"a*b", "axb"}, {"*?*", "é"}, {"a?c*", "abcd"}, {"**a", "ba"}, {"?", "\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		got := rules.Glob(pattern, key)
		if len(pattern) > 64 || !utf8.ValidString(pattern) || !utf8.ValidString(key) {
			return
		}
		if want := globRegexp(pattern).MatchString(key); got != want {
			t.Fatalf("Glob(%q, %q) = %v, want %v", pattern, key, got, want)
		}
	})
}

// FuzzParse feeds arbitrary documents: Parse never panics, every error
// wraps ErrInvalid, and a document it accepts builds a Limiter whose
// decisions never panic and never fail for a valid key and n = 1 except
// by the deny list.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sample), "acme")
	f.Add([]byte(`{"default": {"rate": "1/s", "burst": 1}}`), "k")
	f.Add([]byte(`{"default": {"limit": 2, "window": "1s"}, "rules": [{"pattern": "*a?", "tier": "t"}], "tiers": {"t": {"rate": "5/m", "burst": 2}}}`), "xab")
	f.Add([]byte(`{"default": {"rate": "1/s", "burst": 1}, "deny": {"prefixes": ["a"]}, "allow": {"patterns": ["*"]}}`), "ab")
	f.Fuzz(func(t *testing.T, doc []byte, key string) {
		c, err := rules.Parse(doc)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		l, err := rules.New(c)
		if err != nil {
			return // a limit the limiters reject (a burst too long at its rate)
		}
		defer l.Close()
		if key == "" || len(key) > 1024 {
			return
		}
		_, err = l.Allow(ctx, key, 1)
		if err != nil && !errors.Is(err, throttle.ErrDenied) {
			t.Fatalf("Allow(%q): %v", key, err)
		}
		if _, err := l.Lookup(key); err != nil {
			t.Fatalf("Lookup(%q): %v", key, err)
		}
	})
}
