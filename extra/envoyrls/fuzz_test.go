package envoyrls

import (
	"errors"
	"testing"
)

// Any file either loads or is refused with a ConfigError; a loaded one
// resolves any descriptor without a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "k", "vv")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unlimited: true}\n"), "a", "x")
	f.Add([]byte("{domain: [1]}"), "", "")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		cfg, err := parse([]configFile{{Name: "f", Data: data}}, LoadOptions{MergeDomains: true})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not a ConfigError", err)
			}
			return
		}
		for _, d := range cfg.Domains() {
			cfg.lookup(d, desc(key, value, key, value).Entries)
			cfg.lookup(d, desc(key, value).Entries)
		}
	})
}
