package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/daemon"
	"github.com/throttlekit/throttle/distributed/daemon/client"
	"github.com/throttlekit/throttle/tokenbucket"
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

// A client that backs off only after 3 consecutive failures, and answers
// failed queries with a local limit meanwhile: the daemon's 100/s
// shared by 4 processes, 25/s each.
func ExampleWithFallback() {
	local, _ := tokenbucket.New(throttle.PerSecond(25), 25)
	c, err := client.New("unix", "/run/throttled.sock", client.WithBackoff(3, 100*time.Millisecond, time.Second), client.WithFallback(local))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	d, err := c.Allow(context.Background(), "alice", 1) // no daemon here: the fallback answers
	fmt.Println(d.Allowed, err)
	// Output:
	// true <nil>
}
