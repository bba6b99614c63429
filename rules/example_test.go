package rules_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/rules"
	"github.com/throttlekit/throttle/tokenbucket"
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

// Every tier served by one limiter that is told each key's limit with the
// call: here a local tokenbucket.Limiter; across a fleet, a Redis token
// bucket (redislimit.NewTokenBucket), which is a QuotaAllower too.
func ExampleWithQuotaAllower() {
	c, err := rules.Parse([]byte(`{
	  "default": {"rate": "1/s", "burst": 2},
	  "tiers": {"pro": {"rate": "10/s", "burst": 4}},
	  "rules": [{"prefix": "pro:", "tier": "pro"}]
	}`))
	if err != nil {
		panic(err)
	}
	// The rate and burst given here are placeholders: each call brings its
	// rule's.
	shared, err := tokenbucket.New(throttle.PerSecond(1), 1)
	if err != nil {
		panic(err)
	}
	defer shared.Close()
	l, err := rules.New(c, rules.WithQuotaAllower(shared))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	for _, key := range []string{"alice", "pro:acme"} {
		admitted := 0
		for range 10 {
			if d, err := l.Allow(context.Background(), key, 1); err == nil && d.Allowed {
				admitted++
			}
		}
		fmt.Printf("%-8s %d of 10 admitted at once\n", key, admitted)
	}
	// Output:
	// alice    2 of 10 admitted at once
	// pro:acme 4 of 10 admitted at once
}
