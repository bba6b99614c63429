package storelimit_test

import (
	"context"
	"fmt"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A token bucket per key whose state lives in a Store: here the in-memory
// one; a PostgreSQL table (pglimit.Store) is a drop-in replacement.
func Example() {
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(1), 2)
	if err != nil {
		panic(err)
	}
	l, err := storelimit.New(new(storelimit.Memory), alg)
	if err != nil {
		panic(err)
	}
	for range 3 {
		d, err := l.Allow(context.Background(), "user:42", 1)
		fmt.Println(d.Allowed, d.Remaining, err)
	}
	// Output:
	// true 1 <nil>
	// true 0 <nil>
	// false 0 <nil>
}
