package capacity_test

import (
	"context"
	"fmt"

	"github.com/throttlekit/throttle/distributed/capacity"
)

// A single server needs no election: Solo makes it the master at once.
func ExampleSolo() {
	ctx, cancel := context.WithCancel(context.Background())
	var e capacity.Election = capacity.Solo{}
	err := e.Campaign(ctx, "127.0.0.1:7000", func(l capacity.Leadership) {
		fmt.Printf("master %s, this replica: %v, term %d\n", l.Master, l.IsMaster, l.Term)
		cancel() // stop at once, for the example
	})
	fmt.Println(err)
	// Output:
	// master 127.0.0.1:7000, this replica: true, term 1
	// context canceled
}
