package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
)

func Example() {
	// A daemon on a free loopback port (normally: cmd/throttled).
	cfg := daemon.DefaultConfig()
	cfg.Listen = []string{"tcp:127.0.0.1:0"}
	cfg.Default = daemon.Limit{Rate: "1/m", Burst: 2}
	s, _ := daemon.New(cfg, nil)
	s.Start()
	defer s.Shutdown(context.Background())

	c, _ := client.New("tcp", s.Addrs()[0].String(), client.WithTimeout(time.Second))
	defer c.Close()
	for range 3 {
		// On any failure Check returns true (fail open) and an error.
		ok, _ := c.Check(context.Background(), "203.0.113.7")
		fmt.Println(ok)
	}
	// Output:
	// true
	// true
	// false
}
