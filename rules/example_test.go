package rules_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
)

// Per-key limits and tiers from a document. In a service, use Open on a
// file and run Watch in a goroutine to pick up edits.
func Example() {
	c, err := rules.Parse([]byte(`{
	  "default": {"rate": "10/s", "burst": 2},
	  "tiers": {"pro": {"rate": "100/s", "burst": 5}},
	  "rules": [{"prefix": "partner:", "tier": "pro"}],
	  "allow": {"keys": ["healthcheck"]},
	  "deny":  {"keys": ["abuser"]}
	}`))
	if err != nil {
		panic(err)
	}
	l, err := rules.New(c)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	for _, key := range []string{"alice", "partner:acme", "healthcheck", "abuser"} {
		admitted := 0
		for i := 0; i < 10; i++ {
			d, err := l.Allow(context.Background(), key, 1)
			if errors.Is(err, throttle.ErrDenied) {
				fmt.Printf("%-13s denied outright\n", key)
				break
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted > 0 {
			fmt.Printf("%-13s %d of 10 admitted at once\n", key, admitted)
		}
	}
	// Output:
	// alice         2 of 10 admitted at once
	// partner:acme  5 of 10 admitted at once
	// healthcheck   10 of 10 admitted at once
	// abuser        denied outright
}
